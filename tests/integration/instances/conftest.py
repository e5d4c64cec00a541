"""Fixtures for supervisor-side worker tests with real processes: the fake-worker launcher (fake_worker.py
beside this file) and its fast timings; the short run dir and open channel are the unit tests' own."""

from __future__ import annotations

import os
import sys

import pytest
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.instances.launcher import Launcher
from unit.instances.conftest import channel, run_dir  # noqa: F401 - fixtures shared with tests/unit/instances

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
def fake_launcher(run_dir):  # noqa: F811 - the fixture imported above, asked for by name
    return Launcher(run_dir, command=[sys.executable, "-s", FAKE_WORKER])
