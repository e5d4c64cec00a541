"""Ties the worker's life to its supervisor's.

Three independent ways out, so a worker never outlives the supervisor:
1. `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills us when the parent thread exits (Linux);
2. the parent pid check right after arming (the parent may have died before prctl);
3. a daemon thread blocked reading the supervisor's stdin pipe: EOF means the supervisor is gone.
(The heartbeat timeout in channel.py is the fourth, for a supervisor that hangs.)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Optional

PR_SET_PDEATHSIG = 1


def prctl(option: int, value: int) -> bool:
    """Linux's prctl(option, value); False where unsupported (non-Linux) or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` when our parent exits. False where unsupported (non-Linux)."""
    return prctl(PR_SET_PDEATHSIG, int(sig))


def read_line(fd: int, limit: int = 1 << 20) -> bytes:
    """One line from a raw fd, without buffering past the newline's chunk (the rest is ignored)."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("bootstrap line longer than %d bytes" % limit)
    return data.split(b"\n", 1)[0]


def _watch(fd: int, on_lost: Callable[[str], None]) -> None:
    try:
        while True:
            if not os.read(fd, 4096):
                break
    except OSError:
        pass
    on_lost("stdin closed: supervisor is gone")


def arm(supervisor_pid: Optional[int], on_lost: Callable[[str], None], stdin_fd: int = 0) -> threading.Thread:
    """Arm all lifelines. `on_lost(reason)` must not return (it exits the process).

    The supervisor pipe is moved off fd 0 (which becomes /dev/null), so model code that reads
    stdin cannot steal the EOF signal or block on it.
    """
    set_parent_death_signal(signal.SIGKILL)
    if supervisor_pid and os.getppid() != supervisor_pid:
        on_lost("parent pid %d is not the supervisor %d" % (os.getppid(), supervisor_pid))
    pipe_fd = os.dup(stdin_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, stdin_fd)
    os.close(devnull)
    thread = threading.Thread(target=_watch, args=(pipe_fd, on_lost), name="inferd-lifeline", daemon=True)
    thread.start()
    return thread
