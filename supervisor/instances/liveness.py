"""Is a silent worker hung, or only busy? Asked of the kernel, so that the answer never needs the
worker's GIL (a model may hold it for seconds in a long C call: a regex, a native library).

A worker's heartbeats come from a thread of its own, which needs the GIL. When they stop for longer
than the heartbeat limit L (interval x misses), the supervisor looks at the process in /proc:
- stopped (SIGSTOP, state T or t): hung at once (detected after L);
- its threads used CPU over the last window of L (at least BUSY_CPU_FRACTION of one core): busy,
  not hung; it is looked at again every window while it stays silent;
- no CPU progress over a whole window of L: hung (deadlocked; detected after about 2 x L).
Without /proc (not Linux) every silent worker is hung after L, as before.
"""

from __future__ import annotations

import enum
import os

BUSY_CPU_FRACTION = 0.01  # CPU time per second of silence that means "working" (the zmq I/O thread
# answering heartbeats costs microseconds a second; a model holding the GIL costs a whole core)


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
