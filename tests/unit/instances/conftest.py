"""Fixtures for supervisor-side worker tests: a short run dir, an open channel (the fake-worker launcher,
which starts processes, is in tests/integration/instances/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from inferd.supervisor.instances.channel import Channel


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
