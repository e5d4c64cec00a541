"""Busy polling (`--busy-poll-us`): the event loop polls instead of sleeping for a while after a request.

On a virtual machine, waking a process that sleeps on an idle vCPU costs the waker ~30 µs inside its
send call (bench/RESULTS.md, "the wake-up floor"). A batch of 32 answers brings 32 new requests, and
each of them, and the worker's result, wakes the supervisor again. While this is on, the loop keeps
passing (epoll with no timeout) for up to the window after the last admitted request, so nothing has
to wake it. Each pass yields the CPU first. While more processes are runnable than there are CPUs,
polling would take a CPU from a worker: the loop sleeps instead and looks again 1 ms later. An idle
server sleeps once the window has passed, so the cost is CPU time under load, never at rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

log = logging.getLogger("inferd.busy_poll")

_LOAD_CHECK_S = 0.0005  # how often a polling loop reads how many processes are runnable
_LOAD_BACKOFF_S = 0.001  # how long it sleeps when every CPU is wanted, before it looks again


def runnable_processes() -> int:
    """Processes running or ready to run on the whole machine now (the 4th field of /proc/loadavg)."""
    with open("/proc/loadavg", "rb") as f:
        return int(f.read().split()[3].split(b"/")[0])


class BusyPoll:
    """Keeps the running loop polling for `window_us` after each `poke()`; owned by the app, closed at exit."""

    def __init__(self, window_us: int, cpus: int | None = None) -> None:
        if window_us <= 0:
            raise ValueError("a busy-poll window is a positive number of microseconds")
        self._window_s = window_us / 1e6
        self._cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
        self._until = 0.0
        self._next_check = 0.0
        self._handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.passes = 0  # loop passes spent polling (tests, and a hint when tuning the window)
        self.stops_for_load = 0  # times the loop slept because every CPU was wanted
        self._off = False  # closed, or no way to tell the machine's load: never poll again

    @property
    def polling(self) -> bool:
        """The window is open (the loop polls, or sleeps a moment while every CPU is wanted)."""
        return self._handle is not None

    def poke(self) -> None:
        """A request was admitted: poll until the window after it has passed."""
        now = time.monotonic()
        self._until = now + self._window_s
        if self._handle is None and not self._off:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._next_check = now
            self._handle = self._loop.call_soon(self._pass)

    def close(self) -> None:
        self._off = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _pass(self) -> None:
        now = time.monotonic()
        if now >= self._until:
            self._handle = None  # the loop sleeps in its next poll; the next poke starts again
            return
        assert self._loop is not None
        if now >= self._next_check and self._cpus_all_wanted(now):
            # the loop sleeps until I/O or this timer: the CPU goes to whoever was waiting for it
            self._handle = self._loop.call_later(_LOAD_BACKOFF_S, self._pass)
            return
        self.passes += 1
        os.sched_yield()  # a runnable process on this CPU goes first
        self._handle = self._loop.call_soon(self._pass)

    def _cpus_all_wanted(self, now: float) -> bool:
        self._next_check = now + _LOAD_CHECK_S
        try:
            busy = runnable_processes() > self._cpus  # this process counts itself
        except (OSError, ValueError, IndexError):
            log.warning("cannot read /proc/loadavg: busy polling is off from now on")
            self._off = True
            return True
        if busy:
            self.stops_for_load += 1
        return busy
