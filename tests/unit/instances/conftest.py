"""Fixtures for supervisor-side worker tests: a short run dir, an open channel, a fake-worker launcher."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.instances.channel import Channel
from inferd.supervisor.instances.launcher import Launcher

FAKE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_worker.py")

FAST = WorkerTimings(
    heartbeat_interval_s=0.05,
    heartbeat_misses=4,
    spawn_timeout_s=10.0,
    load_timeout_s=10.0,
    autocomplete_timeout_s=10.0,
    stop_timeout_s=2.0,
    restart_base_s=0.05,
    restart_cap_s=0.2,
    restart_give_up=3,
    healthy_run_s=5.0,
)


@pytest.fixture
def run_dir():
    path = tempfile.mkdtemp(prefix="inferd-t")  # short: ipc paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def channel(run_dir):
    ch = Channel(run_dir)
    ch.open()
    yield ch
    ch.close()


@pytest.fixture
def fake_launcher(run_dir):
    return Launcher(run_dir, command=[sys.executable, "-s", FAKE_WORKER])
