"""Custom metrics of Python models (`pb_utils.MetricFamily` / `Metric`): the rules both sides apply.

The worker checks a model's families and metrics as they are created (so the model gets the error at
once, as in Triton); the supervisor checks what a worker reports again before exporting anything, since
it trusts no worker. Bounds here are per worker process; the supervisor adds a server-wide one.

Non-finite numbers travel as the strings "NaN", "+Inf" and "-Inf" (JSON has no literal for them).
Runs on Python 3.9+ with the standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Optional, Union

COUNTER = 0
GAUGE = 1
HISTOGRAM = 2
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

SUFFIX = "/metrics"  # identity suffix of the worker's socket for metrics reports

# What one worker's models may create (families and label sets alive at once).
MAX_FAMILIES = 100
MAX_METRICS = 1000  # label sets over all families of the worker
MAX_LABELS = 32  # labels of one metric
MAX_NAME_CHARS = 200  # a family name, a label name
MAX_LABEL_VALUE_CHARS = 1024
MAX_DESCRIPTION_CHARS = 4096
MAX_BUCKETS = 100

# The server's own families (Triton's, and inferd's under the reserved prefix): a model may not
# create one of these, which would let it write into the server's own counters (Triton 2.51 allows
# it: a model's "nv_inference_count" counter with labels model/version adds to Triton's own).
RESERVED_PREFIX = "inferd_"
RESERVED_NAMES = frozenset((
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
    "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us", "nv_inference_first_response_histogram_ms",
    "nv_model_load_duration_secs",
    "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model", "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model", "nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model",
    "nv_cache_util", "nv_cache_num_entries", "nv_cache_num_hits", "nv_cache_num_misses",
    "nv_cache_num_lookups", "nv_cache_num_evictions", "nv_cache_lookup_duration", "nv_cache_insertion_duration",
    "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes",
    "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
    "nv_gpu_power_limit", "nv_energy_consumption",
    "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
))

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")  # Prometheus metric names
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")  # Prometheus label names
NAME_RULE = "[a-zA-Z_:][a-zA-Z0-9_:]*, not starting with '__'"
LABEL_RULE = "[a-zA-Z_][a-zA-Z0-9_]*, not starting with '__'"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def family_error(name: Any, description: Any, kind: Any) -> Optional[str]:
    """Why a family cannot be created (None: it can)."""
    if type(name) is not str:
        return "the name must be a string"
    if type(description) is not str:
        return "the description must be a string"
    if type(kind) is not int or kind not in KIND_NAMES:
        return "unknown metric kind %r (MetricFamily.COUNTER, GAUGE or HISTOGRAM)" % (kind,)
    if len(name) > MAX_NAME_CHARS:
        return "Invalid metric name '%s': longer than %d characters" % (_clip(name), MAX_NAME_CHARS)
    if not _NAME_RE.match(name) or name.startswith("__"):
        return "Invalid metric name '%s': metric names match %s" % (_clip(name), NAME_RULE)
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIX):
        return "metric family name '%s' is reserved for the server's own metrics" % name
    if len(description) > MAX_DESCRIPTION_CHARS:
        return "the description of '%s' is longer than %d characters" % (name, MAX_DESCRIPTION_CHARS)
    return None


def labels_error(labels: Any) -> Optional[str]:
    """Why `labels` (a dict of label name -> value) cannot label a metric (None: they can)."""
    if not isinstance(labels, dict):
        return "Labels must be a dictionary."
    if len(labels) > MAX_LABELS:
        return "more than %d labels" % MAX_LABELS
    for key, value in labels.items():
        if type(key) is not str:
            return "Invalid label name %r: label names are strings" % (key,)
        if len(key) > MAX_NAME_CHARS or not _LABEL_RE.match(key) or key.startswith("__"):
            return "Invalid label name '%s': label names match %s" % (_clip(key), LABEL_RULE)
        if type(value) is not str:
            return "the value of label '%s' must be a string, not %s" % (key, type(value).__name__)
        if len(value) > MAX_LABEL_VALUE_CHARS:
            return "the value of label '%s' is longer than %d characters" % (key, MAX_LABEL_VALUE_CHARS)
    return None


def check_buckets(buckets: Any) -> tuple[float, ...]:
    """Histogram bucket boundaries as a tuple (a last +Inf one left out: the +Inf bucket always
    exists); ValueError saying why they cannot be used."""
    if not isinstance(buckets, (list, tuple)):
        raise ValueError("Buckets must be a list.")
    bounds: list[float] = []
    for b in buckets:
        if isinstance(b, (str, bytes, bool)):
            raise ValueError("bucket boundaries must be numbers, not %s" % type(b).__name__)
        try:
            bounds.append(float(b))
        except (TypeError, ValueError):
            raise ValueError("bucket boundaries must be numbers, not %s" % type(b).__name__) from None
    if bounds and bounds[-1] == math.inf:
        bounds.pop()
    if len(bounds) > MAX_BUCKETS:
        raise ValueError("more than %d bucket boundaries" % MAX_BUCKETS)
    if any(math.isnan(b) or math.isinf(b) for b in bounds):
        raise ValueError("bucket boundaries must be finite (the +Inf bucket is always there)")
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError("Bucket Boundaries must be strictly sorted")
    return tuple(bounds)


_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}


def encode_number(value: float) -> Union[float, str]:
    """A float for JSON: finite ones as they are, others as "NaN" / "+Inf" / "-Inf"."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return value


def decode_number(value: Any) -> float:
    """Inverse of `encode_number`; ValueError on anything else."""
    if type(value) is float or (type(value) is int and -(1 << 63) <= value < 1 << 64):
        return float(value)
    if type(value) is str and value in _SPECIAL:
        return _SPECIAL[value]
    raise ValueError("not a number: %r" % (_clip(repr(value)),))


def decode_count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError("not a count: %r" % (_clip(repr(value)),))
    return value


def encode_numbers(values: Sequence[float]) -> list[Union[float, str]]:
    return [encode_number(v) for v in values]
