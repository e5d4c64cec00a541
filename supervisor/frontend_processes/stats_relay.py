"""Statistics of the requests a frontend process sent straight to workers, relayed to the core.

A direct version's local scheduler records into a `Recorder` (the scheduler's StatsSink), which only
appends a row [serial, method index, args...] to the relay; the rows go to the core in one STATS frame
at most every FLUSH_S, and at once when the core asks (a statistics or metrics query pulls every frontend
first, so a client that saw its answer sees it counted). The core replays them into the version's
ModelStats (direct_core.replay): the figures, histograms and summaries are the core's, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..scheduler.default import StatsSink

FLUSH_S = 0.05  # the longest a row waits here unasked
MAX_ROWS = 65536  # rows kept while the link cannot take them (beyond: the oldest are dropped)

# the StatsSink methods, by index (direct_core.METHODS: the same order)
SUCCESS, SUCCESSES, FAILURE, EXECUTION = range(4)


class StatsRelay:
    def __init__(self, send: Callable[[dict[str, Any], int], None],
                 inflight: Callable[[], dict[str, Any]] | None = None) -> None:
        self._send = send  # (document, pull call id or 0): one STATS frame
        self.inflight = inflight  # what a pull also answers: {"inflight": per version and instance, "pending": ...}
        self.rows: list[Any] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, row: list[Any]) -> None:
        rows = self.rows
        rows.append(row)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
        elif len(rows) > MAX_ROWS:
            del rows[: len(rows) - MAX_ROWS]

    def flush(self, pull: int = 0) -> None:
        """Send what is recorded (and answer the core's pull `pull`, even with nothing)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self.rows = self.rows, []
        if pull:
            counts = self.inflight() if self.inflight is not None else {}
            self._send({"rows": rows, "inflight": counts.get("inflight", {}), "pending": counts.get("pending", {})},
                       pull)
        elif rows:
            self._send({"rows": rows}, 0)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Recorder(StatsSink):
    """One direct version's StatsSink (scheduler.default.StatsSink): rows for the relay."""

    __slots__ = ("_serial", "_add")

    def __init__(self, serial: int, relay: StatsRelay) -> None:
        self._serial = serial
        self._add = relay.add

    def record_success(self, batch_items: int, request_ns: int, queue_ns: int, compute_input_ns: int,
                       compute_infer_ns: int, compute_output_ns: int) -> None:
        self._add([self._serial, SUCCESS, batch_items, request_ns, queue_ns, compute_input_ns, compute_infer_ns,
                   compute_output_ns])

    def record_successes(self, arrivals: Sequence[int], start_ns: int, end_ns: int, compute_input_ns: int,
                         compute_infer_ns: int, compute_output_ns: int) -> None:
        # monotonic_ns readings of this process: the core's clock is the same (CLOCK_MONOTONIC is system-wide)
        self._add([self._serial, SUCCESSES, list(arrivals), start_ns, end_ns, compute_input_ns, compute_infer_ns,
                   compute_output_ns])

    def record_failure(self, reason: str, request_ns: int) -> None:
        self._add([self._serial, FAILURE, reason, request_ns])

    def record_execution(self, batch_size: int, compute_input_ns: int, compute_infer_ns: int,
                         compute_output_ns: int) -> None:
        self._add([self._serial, EXECUTION, batch_size, compute_input_ns, compute_infer_ns, compute_output_ns])
