"""Latency summaries (tritonserver ``--metrics-config summary_latencies=true``): quantiles over a sliding
time window, in bounded memory.

Each model version with summaries on keeps one ring (a ``deque`` with a ``maxlen``) of its recent
requests, an entry per request holding the time it finished and its five durations in microseconds
(request, queue, compute input / infer / output; the compute ones are None for a response-cache hit,
which Triton leaves out of the compute summaries). Recording is a single ``append`` on the event-loop
thread; the quantiles are computed at scrape time from the entries younger than the window, sorted.
When more than ``capacity`` requests finish within the window the quantiles describe the most recent
``capacity`` of them. ``_count`` and ``_sum`` are cumulative, as in prometheus-cpp; they come from the
ModelStats counters (the same totals as the ``*_duration_us`` counters).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# tritonserver 2.51's default quantiles and their allowed errors (the errors only matter to Triton's
# streaming estimator; here the quantiles are exact over the kept observations)
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05), (0.9, 0.01), (0.95, 0.005), (0.99, 0.001), (0.999, 0.0001))
DEFAULT_MAX_AGE_S = 60.0  # prometheus-cpp's default window, which Triton keeps
DEFAULT_CAPACITY = 4096  # observations kept per model version

# the five durations of a ring entry, after its timestamp
REQUEST, QUEUE, COMPUTE_INPUT, COMPUTE_INFER, COMPUTE_OUTPUT = range(1, 6)

# a request: (finished ms, request, queue, compute input, infer, output µs); the cache summaries' rings
# (cache hits, cache misses) hold (finished ms, duration µs)
Entry = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class LatencyMetricsConfig:
    """What --metrics-config asks of the per-model latency metrics."""

    counters: bool = True  # counter_latencies: the nv_inference_*_duration_us counters
    summaries: bool = False  # summary_latencies: the nv_inference_*_summary_us summaries
    histograms: bool = False  # histogram_latencies: nv_inference_first_response_histogram_ms
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES  # summary_quantiles: (quantile, error)
    max_age_s: float = DEFAULT_MAX_AGE_S
    capacity: int = DEFAULT_CAPACITY


class LatencyRing:
    """The recent requests of one model version (see the module doc)."""

    __slots__ = ("entries", "max_age_ms")

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.entries: deque[Entry] = deque(maxlen=max(1, capacity))
        self.max_age_ms = int(max_age_s * 1000)

    def recent(self, now_ms: int | None = None) -> list[Entry]:
        """The entries inside the window; older ones are dropped from the ring."""
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        entries = self.entries
        oldest = now_ms - self.max_age_ms
        while entries and entries[0][0] < oldest:
            entries.popleft()
        return list(entries)


def quantiles(values: Sequence[int], qs: Sequence[float]) -> list[float]:
    """The value at rank floor(q * n) of the sorted values (the upper one at q = 0.5 with an even n),
    NaN for every q when there are no values."""
    n = len(values)
    if not n:
        return [float("nan")] * len(qs)
    ordered = sorted(values)
    return [ordered[min(n - 1, max(0, int(q * n)))] for q in qs]


def column(entries: Sequence[Entry], index: int) -> list[int]:
    """One duration of the entries, leaving out those that lack it (cache hits' compute durations)."""
    return [v for e in entries if (v := e[index]) is not None]


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """summary_quantiles's value: "<quantile>:<error>,..." (e.g. "0.5:0.05,0.99:0.001")."""
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        q_text, sep, err_text = part.strip().partition(":")
        try:
            q, err = float(q_text), float(err_text)
        except ValueError:
            raise ValueError(f"summary_quantiles={text}: expected <quantile>:<error>,... "
                             "(e.g. 0.5:0.05,0.99:0.001)") from None
        if not sep or not 0.0 <= q <= 1.0 or not 0.0 <= err <= 1.0:
            raise ValueError(f"summary_quantiles={text}: quantiles and errors must be in [0, 1]")
        out.append((q, err))
    return tuple(out)
