"""Busy polling (`--busy-poll-us`, on by default): the event loop polls instead of sleeping for a while
after a request, while requests come one at a time (concurrency 1).

On a virtual machine, waking a process that sleeps on an idle vCPU costs the waker ~30 µs inside its
send call, and the woken loop runs cold (bench/RESULTS.md, "the wake-up floor"). A client at concurrency
1 wakes the supervisor with each request, the worker with each result; a loop that is still polling when
they arrive needs no wake-up. A request that found its model with nothing else in flight ("alone"),
within the window after another such request, opens (or extends) a window of polling. Sparser traffic
never polls; neither does a busy server (requests overlap): there the loop seldom sleeps anyway, and a
polling vCPU only takes from its neighbours (bench/RESULTS.md: -2 to -7% at concurrency 16 and 32).
While a window is open the loop keeps passing (epoll with no timeout), yielding the CPU first on each
pass. While more processes are runnable than there are CPUs, polling would take a CPU from a worker:
the loop sleeps instead and looks again 1 ms later. An idle server sleeps once the window has passed.

While the loop polls, each Execute asks its worker to poll for the next one as well (instances/poll_hint.py):
a worker asleep between requests would cost the same wake-up on its side.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from ..instances.poll_hint import HINT

log = logging.getLogger("inferd.busy_poll")

DEFAULT_WINDOW_US = 1000  # the window by default: above a fast model's round trip at concurrency 1
_LOAD_CHECK_S = 0.0005  # how often a polling loop reads how many processes are runnable
_LOAD_BACKOFF_S = 0.001  # how long it sleeps when every CPU is wanted, before it looks again


def runnable_processes() -> int:
    """Processes running or ready to run on the whole machine now (the 4th field of /proc/loadavg)."""
    with open("/proc/loadavg", "rb") as f:
        return int(f.read().split()[3].split(b"/")[0])


def cpu_quota(cgroup_root: Path = Path("/sys/fs/cgroup"),
              self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs this process's cgroups may use per period (a container's CPU limit, a systemd CPUQuota=), the
    smallest over its cgroup and the ones above it, or None when unlimited or unknown. Polling spends the
    quota, so the default polling stays off under one."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    v2 = next((line[3:] for line in lines if line.startswith("0::")), None)
    v1 = next((line.split(":", 2)[2] for line in lines
               if line.count(":") >= 2 and "cpu" in line.split(":", 2)[1].split(",")), None)
    quotas = [q for d in _up_from(cgroup_root, v2 or "/") if (q := _v2_quota(d)) is not None]
    quotas += [q for d in _up_from(cgroup_root / "cpu", v1 or "/") if (q := _v1_quota(d)) is not None]
    return min(quotas) if quotas else None


def _up_from(root: Path, path: str) -> list[Path]:
    """`root`/`path` and each folder above it up to `root` (a limit may sit on any of them)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_quota(folder: Path) -> float | None:
    try:  # "<quota> <period>" or "max <period>"
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:  # -1 when unlimited
        quota_us = int((folder / "cpu.cfs_quota_us").read_text())
        period_us = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota_us < 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def default_window_us(cpus: int, quota: float | None) -> int:
    """The window `--busy-poll-us` defaults to: 0 (off) with one CPU or under a CPU quota."""
    return 0 if cpus < 2 or quota is not None else DEFAULT_WINDOW_US


class BusyPoll:
    """Keeps the running loop polling for `window_us` after each `poke(alone=True)` that came within
    `window_us` of another such poke; owned by the app, closed at exit."""

    def __init__(self, window_us: int, cpus: int | None = None) -> None:
        if window_us <= 0:
            raise ValueError("a busy-poll window is a positive number of microseconds")
        self._window_s = window_us / 1e6
        self._cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
        self._last_poke = -1e9
        self._last_alone = False
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

    def poke(self, alone: bool = True) -> None:
        """A request was admitted (`alone`: its model had nothing else queued or running). Poll until the
        window after it has passed when it and the one before came alone, that one within the window:
        the next will likely come within the window too, and find the loop with nothing else to do."""
        now = time.monotonic()
        start = alone and self._last_alone and now - self._last_poke < self._window_s
        self._last_poke, self._last_alone = now, alone
        if self._handle is not None:
            if alone:
                self._until = now + self._window_s
                if HINT.until:  # (not while the loop sleeps for load)
                    HINT.until = self._until
        elif start and not self._off:
            self._until = HINT.until = now + self._window_s
            HINT.window_us = round(self._window_s * 1e6)
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._next_check = now
            self._handle = self._loop.call_soon(self._pass)

    def close(self) -> None:
        self._off = True
        HINT.until = 0.0
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _pass(self) -> None:
        now = time.monotonic()
        if now >= self._until:
            self._handle = None  # the loop sleeps in its next poll; a request soon after the last opens it again
            HINT.until = 0.0
            return
        assert self._loop is not None
        if now >= self._next_check and self._cpus_all_wanted(now):
            # the loop sleeps until I/O or this timer: the CPU goes to whoever was waiting for it (workers
            # too: they are not asked to poll meanwhile)
            HINT.until = 0.0
            self._handle = self._loop.call_later(_LOAD_BACKOFF_S, self._pass)
            return
        HINT.until = self._until
        self.passes += 1
        os.sched_yield()  # a runnable process on this CPU goes first
        self._handle = self._loop.call_soon(self._pass)

    def _cpus_all_wanted(self, now: float) -> bool:
        self._next_check = now + _LOAD_CHECK_S
        try:
            # this process counts itself, and a worker polling at its request counts as its own
            busy = runnable_processes() > self._cpus + HINT.worker_may_poll(now)
        except (OSError, ValueError, IndexError):
            log.warning("cannot read /proc/loadavg: busy polling is off from now on")
            self._off = True
            return True
        if busy:
            self.stops_for_load += 1
        return busy
