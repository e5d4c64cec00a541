"""Is a silent worker hung, or only busy? Asked of the kernel, so that the answer never needs the
worker's GIL (a model may hold it for seconds in a long C call: a regex, a native library).

A worker's heartbeats come from a thread of its own, which needs the GIL. When they stop for longer
than the heartbeat limit L (interval x misses), the supervisor looks at the process in /proc:
- stopped (SIGSTOP, state T or t): hung at once (detected after L);
- its threads used CPU over the last window of L (at least BUSY_CPU_FRACTION of one core): busy,
  not hung; it is looked at again every window while it stays silent;
- no CPU progress over a whole window of L: hung (deadlocked; detected after about 2 x L).
Without /proc (not Linux) every silent worker is hung after L, as before.

`Watchdog` is that loop for one worker: it pings, notes each heartbeat (the worker answers each ping, and
only then: it sleeps in between), and asks `Probe` once silent. A worker with work (a batch or stream to
answer, a control message, starting or stopping) is pinged every interval and judged from the moment the
work was sent; an idle one is pinged only every IDLE_PROBE_S (at least L), so that it wakes about once
then (issue 41 item 5), and is judged silent after that period plus L.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from collections.abc import Awaitable, Callable

log = logging.getLogger("inferd.instances.worker")

BUSY_CPU_FRACTION = 0.01  # CPU time per second of silence that means "working" (the heartbeat thread
# answering pings costs microseconds a second; a model holding the GIL costs a whole core)
IDLE_PROBE_S = 1.0  # the least time between pings of an idle worker (the period is max(this, L))


class Verdict(str, enum.Enum):
    WATCHING = "watching"  # not enough seen yet
    BUSY = "busy"
    STOPPED = "stopped"
    STALLED = "stalled"


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, T, t, Z, ...); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    tail = raw[raw.rfind(b")") + 1:].split()  # the command name may hold spaces and parentheses
    return tail[0].decode("ascii", "replace") if tail else None


def cpu_ns(pid: int) -> int | None:
    """Nanoseconds on CPU of all the process's threads (schedstat: exact, not clock ticks)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended, or a kernel without schedstat
    return total


class Probe:
    """The verdicts for one worker process while its heartbeats are missing."""

    def __init__(self, pid: int, window_s: float) -> None:
        self.pid = pid
        self.window_s = window_s
        self.available = os.path.isdir(f"/proc/{pid}/task")
        self._mark: tuple[float, int] | None = None  # (loop time, cpu ns) at the start of this window

    def reset(self) -> None:
        """Heartbeats came back."""
        self._mark = None

    def check(self, now: float) -> Verdict:
        if not self.available:
            return Verdict.STALLED
        state = process_state(self.pid)
        if state is None or state in ("Z", "X"):
            return Verdict.WATCHING  # exiting: the exit watcher reports it
        if state in ("T", "t"):
            return Verdict.STOPPED
        used = cpu_ns(self.pid)
        if used is None:
            return Verdict.WATCHING
        if self._mark is None:
            self._mark = (now, used)
            return Verdict.WATCHING
        since, before = self._mark
        elapsed = now - since
        if used - before >= BUSY_CPU_FRACTION * max(elapsed, 1e-3) * 1e9:
            self._mark = (now, used)
            return Verdict.BUSY
        if elapsed >= self.window_s:
            return Verdict.STALLED
        return Verdict.WATCHING


class Watchdog:
    """One worker's heartbeats: a ping (`ping(seq)`) every interval while it has work (`working()`), every
    max(IDLE_PROBE_S, L) while idle; past the limit of silence (L = interval x misses from the last answer or
    from when work was sent, whichever is later; the idle period plus L while idle; at least
    `starting_silence_s` while the worker starts) the kernel's verdict: a stopped or stalled worker is
    killed (`kill(reason)`), a busy one is logged and left alone."""

    def __init__(self, *, pid: int | None, interval_s: float, misses: int, starting_silence_s: float,
                 ping: Callable[[int], object], settle: Callable[[], Awaitable[None]], starting: Callable[[], bool],
                 kill: Callable[[str], None], who: Callable[[], str], tick: Callable[[], None] | None = None,
                 working: Callable[[], bool] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._interval = interval_s
        self._limit = interval_s * misses
        self.idle_probe_s = max(IDLE_PROBE_S, self._limit)
        self._starting_silence = starting_silence_s
        self._ping = ping
        self._settle = settle  # reads what the channel has queued (the loop may have been busy)
        self._starting = starting
        self._kill = kill
        self._who = who
        self._tick = tick  # run at every tick of the interval (the memory cap's RSS look)
        self._working = working  # None: always treated as working (pinged every interval)
        # silence alone is not hang: a model may hold the GIL for seconds in a C call
        self._probe = Probe(pid, self._limit) if pid is not None else None
        self.last = self._loop.time()  # when the worker was last heard
        self.pings = 0

    def heard(self) -> None:
        self.last = self._loop.time()

    async def run(self, exited: asyncio.Event) -> None:
        """Until the worker exits or is killed here."""
        limit, probe, loop = self._limit, self._probe, self._loop
        busy_since: float | None = None
        working = True
        counted_from = prev_tick = last_ping = loop.time()  # silence counts from the later of this and `last`
        while not exited.is_set():
            await asyncio.sleep(self._interval)
            now = loop.time()
            starting = self._starting()
            was_working = working
            working = starting or self._working is None or self._working()
            if working and not was_working:
                # work was sent since the last tick: a hang is measured from then, not from the idle
                # worker's last answer (up to the idle period ago)
                counted_from = prev_tick
            prev_tick = now
            if working or now - last_ping >= self.idle_probe_s - self._interval / 2:
                self.pings += 1
                self._ping(self.pings)
                last_ping = now
            if self._tick is not None:
                self._tick()
            # while loading, a framework import (torch, onnxruntime: dlopen holds the GIL) may silence
            # the heartbeat thread for seconds; a worker stuck there is caught by the load timeout
            allowed = limit if working else limit + self.idle_probe_s
            if starting:
                allowed = max(allowed, self._starting_silence)
            silent = now - max(self.last, counted_from)
            if silent <= allowed:
                if busy_since is not None:
                    log.info("%s answers heartbeats again after %.1f s busy", self._who(),
                             loop.time() - busy_since)
                    busy_since = None
                if probe is not None:
                    probe.reset()
                continue
            await self._settle()
            silent = loop.time() - max(self.last, counted_from)
            if silent <= allowed:
                continue
            verdict = probe.check(loop.time()) if probe is not None else Verdict.STALLED
            if verdict is Verdict.STOPPED:
                self._kill(f"hung: no heartbeat for {silent:.1f} s (process stopped)")
                return
            if verdict is Verdict.STALLED:
                self._kill(f"hung: no heartbeat for {silent:.1f} s and no CPU progress for {limit:g} s")
                return
            if verdict is Verdict.BUSY and busy_since is None:
                busy_since = self.last
                log.info("%s is busy: no heartbeat for %.1f s but using CPU (a long call holding the "
                         "GIL?); not hung", self._who(), silent)
