"""EXECUTION_ENV_PATH must name a regular file (a tarball) or a directory: a FIFO or a device used to block
an executor thread for ever (two of them blocked every later environment load); hashing is bounded."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from inferd.supervisor.envs import EnvError, EnvironmentManager


def _within(seconds: float, fn: Callable[[], Any]) -> BaseException | Any:
    """fn() on a daemon thread: its result or exception, or a failure when it is still running."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"still running after {seconds}s (blocked or reading for ever)")
    return box[0]


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[EnvironmentManager]:
    mgr = EnvironmentManager(str(tmp_path / "cache"))
    yield mgr
    mgr.close()


def test_fifo_is_refused_at_once(tmp_path: Path, manager: EnvironmentManager) -> None:
    fifo = tmp_path / "env.tar.gz"
    os.mkfifo(fifo)
    link = tmp_path / "link.tar.gz"
    link.symlink_to(fifo)
    try:
        for path in (fifo, link):
            err = _within(10, lambda p=path: manager.resolve_sync(str(p)))
            assert isinstance(err, EnvError), err
            assert str(err) == (f"EXECUTION_ENV_PATH {path} is a FIFO: name a conda-pack tarball (a regular file) "
                                "or an unpacked environment (a directory)")
    finally:  # the code before the fix sits in open(): give it a writer so that its thread ends
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


@pytest.mark.parametrize("device,kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_device_is_refused_at_once(manager: EnvironmentManager, device: str, kind: str) -> None:
    err = _within(10, lambda: manager.resolve_sync(device))
    assert isinstance(err, EnvError) and f"EXECUTION_ENV_PATH {device} is {kind}" in str(err), err


def test_socket_is_refused(tmp_path: Path, manager: EnvironmentManager) -> None:
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        err = _within(10, lambda: manager.resolve_sync(str(path)))
    assert isinstance(err, EnvError) and "is a socket" in str(err), err


def test_hashing_is_bounded_in_time(tmp_path: Path) -> None:
    tarball = tmp_path / "env.tar.gz"
    tarball.write_bytes(os.urandom(3 << 20))
    mgr = EnvironmentManager(str(tmp_path / "cache"), hash_timeout_s=0.0)
    try:
        with pytest.raises(EnvError, match=r"reading environment tarball .*env.tar.gz took longer than 0s "
                                           r"\(1.0 MiB of 3.0 MiB read\)"):
            mgr.resolve_sync(str(tarball))
    finally:
        mgr.close()
