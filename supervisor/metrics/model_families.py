"""Triton's per-model families, built at scrape time from the ModelStats of every loaded version
(model_statistics.py): the nv_inference_* counters and gauges, the per-model nv_cache_* counters, the
first-response histogram and the latency summaries (--metrics-config), and inferd's items counter.

They are the very counters behind the statistics JSON, so both always agree (durations here are ``ns // 1000``
µs), and the hot path pays nothing for metrics. Label names are sorted, as prometheus-cpp does.
docs/metrics.md lists every family and its labels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from . import latency_summary as ls
from .latency_histogram import FIRST_RESPONSE, FIRST_RESPONSE_HELP
from .model_statistics import FAILURE_REASONS, ModelStats
from .text_format import Family, escape, le

# (name, help, value getter) of the per-model counters, in Triton's order
_MODEL_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success_count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success_ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue_ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input_ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer_ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda s: s.compute_output_ns // 1000),
)

# in Triton's order and wording (tritonserver 2.51 with --cache-config local,size=...)
_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.cache_hit_count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.cache_hit_ns // 1000),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.cache_miss_count),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss_ns // 1000),
)


# the latency summaries (--metrics-config summary_latencies=true), in Triton's order and wording:
# (name, help, ring entry column, cumulative count, cumulative sum in µs)
_SUMMARIES: tuple[tuple[str, str, int, Callable[[ModelStats], int], Callable[[ModelStats], int]], ...] = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)",
     ls.REQUEST, lambda s: s.success_count, lambda s: s.success_ns // 1000),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)",
     ls.QUEUE, lambda s: s.success_count, lambda s: s.queue_ns // 1000),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     ls.COMPUTE_INPUT, lambda s: s.computed_count, lambda s: s.compute_input_ns // 1000),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     ls.COMPUTE_INFER, lambda s: s.computed_count, lambda s: s.compute_infer_ns // 1000),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     ls.COMPUTE_OUTPUT, lambda s: s.computed_count, lambda s: s.compute_output_ns // 1000),
)


def _summary_families(models: Sequence[ModelStats], labels: Sequence[str],
                      qs: Sequence[tuple[float, float]]) -> list[Family]:
    """The five latency summaries of the versions that keep a latency ring: cumulative _count and _sum,
    then the quantiles over the window (NaN when no request finished in it); "quantile" comes last
    among the labels, as prometheus-cpp writes it."""
    rows = [(s, lab, s.latency.recent()) for s, lab in zip(models, labels, strict=True) if s.latency is not None]
    if not rows:
        return []
    q_labels = [f'quantile="{q:g}"' for q, _ in qs]
    q_values = [q for q, _ in qs]
    families = []
    for name, help_text, index, count, total in _SUMMARIES:
        fam = Family(name, "summary", help_text)
        for s, lab, entries in rows:
            if index == ls.REQUEST and s.cache_enabled:
                continue  # as Triton (its FIXME DLIS-4762): no request summary for a model with the cache on
            fam.lines.append(f"{name}_count{{{lab}}} {count(s)}")
            fam.lines.append(f"{name}_sum{{{lab}}} {total(s)}")
            for q_lab, value in zip(q_labels, ls.quantiles(ls.column(entries, index), q_values), strict=True):
                fam.add(f"{lab},{q_lab}", value)
        if len(fam.lines) > 2:
            families.append(fam)
    for name, help_text, ring, count, total in _CACHE_SUMMARIES:
        fam = Family(name, "summary", help_text)
        for s, lab, _ in rows:
            cache_ring = ring(s)
            if cache_ring is None:
                continue
            fam.lines.append(f"{name}_count{{{lab}}} {count(s)}")
            fam.lines.append(f"{name}_sum{{{lab}}} {total(s)}")
            values = ls.quantiles(ls.column(cache_ring.recent(), 1), q_values)
            for q_lab, value in zip(q_labels, values, strict=True):
                fam.add(f"{lab},{q_lab}", value)
        if len(fam.lines) > 2:
            families.append(fam)
    return families


# with summary_latencies, for the models with the response cache on, in Triton's order and wording:
# (name, help, the ring, cumulative count, cumulative sum in µs)
_CACHE_SUMMARIES: tuple[tuple[str, str, Callable[[ModelStats], ls.LatencyRing | None], Callable[[ModelStats], int],
                              Callable[[ModelStats], int]], ...] = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     lambda s: s.cache_hit_latency, lambda s: s.cache_hit_count, lambda s: s.cache_hit_ns // 1000),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     lambda s: s.cache_miss_latency, lambda s: s.cache_miss_count, lambda s: s.cache_miss_ns // 1000),
)


def _histogram_family(models: Sequence[ModelStats], labels: Sequence[str]) -> list[Family]:
    """nv_inference_first_response_histogram_ms of the versions that keep one (histogram_latencies=true):
    _count, _sum, then the cumulative _bucket lines with "le" last, as prometheus-cpp writes them."""
    rows = [(s.first_response, lab) for s, lab in zip(models, labels, strict=True) if s.first_response is not None]
    if not rows:
        return []
    name = FIRST_RESPONSE
    fam = Family(name, "histogram", FIRST_RESPONSE_HELP)
    for hist, lab in rows:
        fam.lines.append(f"{name}_count{{{lab}}} {hist.count}")
        fam.lines.append(f"{name}_sum{{{lab}}} {hist.total}")
        running = 0
        for bound, n in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
            running += n
            fam.lines.append(f'{name}_bucket{{{lab},le="{le(bound)}"}} {running}')
    return [fam]


def model_tags(s: ModelStats) -> str:
    """The model's metric_tags as labels "_<key>", sorted, with a trailing comma (Triton puts them on every
    per-model metric; every tag label sorts before model/reason/version and instance/state)."""
    # with --model-namespacing, its repository too (Triton's label "namespace": one name may be several models)
    namespace = f'namespace="{escape(s.namespace)}",' if s.namespace else ""
    if not s.metric_tags:
        return namespace
    return "".join(f'_{key}="{escape(value)}",' for key, value in sorted(s.metric_tags)) + namespace


def model_families(models: Sequence[ModelStats], pending: Mapping[tuple[str, str], int],
                   latency: ls.LatencyMetricsConfig) -> list[Family]:
    """Every per-model family of these versions; `pending`: (model, version) -> requests queued."""
    labels = [f'{model_tags(s)}model="{escape(s.name)}",version="{escape(s.version)}"' for s in models]
    families: list[Family] = []

    success_name, success_help, success_get = _MODEL_COUNTERS[0]
    fam = Family(success_name, "counter", success_help)
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, success_get(s))
    families.append(fam)

    fam = Family("nv_inference_request_failure", "counter",
                 "Number of failed inference requests, all batch sizes")
    for s in models:
        model, version, tags = escape(s.name), escape(s.version), model_tags(s)
        for reason in FAILURE_REASONS:
            fam.add(f'{tags}model="{model}",reason="{reason}",version="{version}"',
                    s.fail_by_reason[reason])
    families.append(fam)

    for name, help_text, get in _MODEL_COUNTERS[1:]:
        if not latency.counters and name.endswith("_duration_us"):  # --metrics-config counter_latencies=false
            continue
        fam = Family(name, "counter", help_text)
        for s, lab in zip(models, labels, strict=True):
            fam.add(lab, get(s))
        families.append(fam)

    fam = Family("nv_inference_pending_request_count", "gauge",
                 "Instantaneous number of pending requests awaiting execution per-model.")
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, pending.get((s.name, s.version), 0))
    families.append(fam)

    fam = Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, float(s.load_duration_s))
    families.append(fam)

    # as Triton: the per-model cache counters go with the latency counters (counter_latencies=false)
    cached = [(s, lab) for s, lab in zip(models, labels, strict=True) if s.cache_enabled and latency.counters]
    if cached:
        for name, help_text, get in _CACHE_COUNTERS:
            fam = Family(name, "counter", help_text)
            for s, lab in cached:
                fam.add(lab, get(s))
            families.append(fam)

    fam = Family("inferd_inference_request_items_total", "counter",
                 "Batch items in successful inference requests (includes cached requests)")
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, s.success_items)
    families.append(fam)
    families += _histogram_family(models, labels)
    families += _summary_families(models, labels, latency.quantiles)
    return families
