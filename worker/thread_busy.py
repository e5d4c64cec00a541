"""How long the calling thread has been busy: on a CPU, or runnable and waiting for one (merged_serving.py tells
an execute that computes from one that waits by it; CPU time alone would make a computing thread on a host whose
CPUs are all taken look idle)."""

from __future__ import annotations

import os
import threading
import time

_local = threading.local()


class _Schedstat:
    """This thread's /proc/thread-self/schedstat, open while the thread lives (closed with its thread-local)."""

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = -1

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def busy_ns() -> int:
    """The calling thread's time on a CPU plus its time waiting for one, so far (ns): what is not blocked.
    Read from /proc/thread-self/schedstat (one pread of a descriptor each thread keeps), so that a thread
    that computes on a host whose CPUs are all taken still counts as busy; its CPU time alone where that file
    is missing."""
    stat = getattr(_local, "schedstat", None)
    if stat is None:
        stat = _local.schedstat = _Schedstat()
    if stat.fd >= 0:
        try:
            running, waiting = os.pread(stat.fd, 128, 0).split()[:2]
            return int(running) + int(waiting)
        except (OSError, ValueError):
            pass
    return time.thread_time_ns()
