"""The first-response latency histogram (tritonserver ``--metrics-config histogram_latencies=true``, Triton 2.52
and later; for models that are not decoupled too since Triton 2.65): one per model version, the time from a
request's arrival to its first response (an error response included), in whole milliseconds as Triton
observes it (``ns // 1_000_000``).

Buckets default to Triton's ``{100, 500, 2000, 5000}`` and are set per model by the config's
``model_metrics { metric_control { metric_identifier { family } histogram_options { buckets } } }``.
Recording is one ``bisect`` and two additions on the event-loop thread; the text is built at scrape time.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

from inferd.worker.wire.errors import invalid_arg

log = logging.getLogger("inferd.metrics")

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"
DEFAULT_BUCKETS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)  # Triton's (metric_model_reporter.h)
CUSTOMIZABLE = (FIRST_RESPONSE,)  # the families model_metrics may set buckets of, as in Triton


class Histogram:
    """Observations per bucket (not cumulative; the last one is +Inf), their count and their sum."""

    __slots__ = ("bounds", "counts", "count", "total")

    def __init__(self, bounds: Sequence[float] = DEFAULT_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0

    def observe_ns(self, ns: int) -> None:
        ms = ns // 1_000_000
        self.counts[bisect_left(self.bounds, ms)] += 1  # a value equal to a bound falls in it (le)
        self.count += 1
        self.total += ms


def bucket_overrides(config: Mapping[str, Any], model: str) -> dict[str, tuple[float, ...]]:
    """family -> buckets of the config's model_metrics (its structure checked at load: repository.normalize);
    a family Triton cannot customize is logged and left out, as Triton does; buckets that are not finite and
    increasing raise INVALID_ARG (prometheus-cpp, under Triton, throws on them)."""
    out: dict[str, tuple[float, ...]] = {}
    for control in (config.get("model_metrics") or {}).get("metric_control") or []:
        family = str((control.get("metric_identifier") or {}).get("family") or "")
        buckets = [float(b) for b in (control.get("histogram_options") or {}).get("buckets") or []]
        if family not in CUSTOMIZABLE:
            log.warning("model '%s': metric family '%s' in 'metric_identifier' is not a customizable metric "
                        "(customizable: %s)", model, family, ", ".join(CUSTOMIZABLE))
            continue
        if not all(math.isfinite(b) for b in buckets) or any(a >= b for a, b in zip(buckets, buckets[1:])):
            raise invalid_arg(f"model '{model}': histogram_options buckets of '{family}' must be finite and in "
                              f"increasing order, got {buckets}")
        out[family] = tuple(buckets)
    return out
