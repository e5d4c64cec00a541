"""Whether a worker should poll for its next Execute instead of sleeping once it has answered one.

While the supervisor's event loop busy-polls (requests come one at a time: core/busy_poll.py), a worker
that sleeps between requests has to be woken for each one: on a virtual machine that is ~20 µs of wake-up
on an idle vCPU, and the woken worker runs cold. So each Execute sent while the loop polls asks its worker
to poll too, for the same window (the Execute's `poll_us`). The loop sets the hint; the instance pipelines
read it as they send. One per process, like the loop it follows.
"""

from __future__ import annotations

import time


class PollHint:
    __slots__ = ("until", "window_us", "asked")

    def __init__(self) -> None:
        self.until = 0.0  # time.monotonic() until which the loop polls
        self.window_us = 0
        self.asked = -1e9  # when an Execute last asked its worker to poll

    def poll_us(self) -> int:
        """The window a worker should poll for after its answer (the caller's Execute asks for it): 0 while
        the loop is not polling."""
        if not self.until:
            return 0
        now = time.monotonic()
        if now >= self.until:
            return 0
        self.asked = now
        return self.window_us

    def worker_may_poll(self, now: float) -> bool:
        """An Execute asked its worker to poll within the last window: it may be polling now, at the
        loop's request (the loop's load check counts it as its own)."""
        return now - self.asked < self.window_us / 1e6


HINT = PollHint()
poll_us = HINT.poll_us
