"""Families of Triton's metrics.md that inferd lacked: the cache hit / miss summaries (with
summary_latencies, no request summary for a model with the response cache on, as Triton 2.51), the per-model
cache counters dropped with counter_latencies=false (as Triton), and the pinned memory pool gauges."""

from __future__ import annotations

from inferd.supervisor.metrics.endpoint import ExtraMetrics, render_metrics
from inferd.supervisor.metrics.latency_summary import LatencyMetricsConfig
from inferd.supervisor.metrics.model_statistics import StatsRegistry
from prometheus_client.parser import text_string_to_metric_families


def _families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def _registry(**cfg) -> StatsRegistry:
    reg = StatsRegistry(LatencyMetricsConfig(**cfg))
    cached = reg.get("cached", 1)
    reg.configure(cached, decoupled=False, cache_enabled=True)
    cached.record_cache_miss(40_000)
    cached.record_execution(1, 1_000, 2_000, 3_000)
    cached.record_success(1, 90_000, 1_000, 1_000, 2_000, 3_000)
    cached.record_cache_hit(19_000, request_ns=25_000, queue_ns=2_000)
    plain = reg.get("plain", 1)
    reg.configure(plain, decoupled=False, cache_enabled=False)
    plain.record_success(1, 50_000)
    return reg


def test_cache_summaries_and_no_request_summary_for_cached_models():
    fams = _families(render_metrics(_registry(summaries=True), system=False))
    hit, miss = fams["nv_cache_hit_summary_per_model"], fams["nv_cache_miss_summary_per_model"]
    assert hit.type == miss.type == "summary"
    assert hit.documentation == "Summary of cache hit counts/durations per model, in microseconds."
    by = {(s.name, s.labels.get("quantile")): s.value for s in hit.samples if s.labels["model"] == "cached"}
    assert by[("nv_cache_hit_summary_per_model_count", None)] == 1
    assert by[("nv_cache_hit_summary_per_model_sum", None)] == 19
    assert by[("nv_cache_hit_summary_per_model", "0.5")] == 19
    assert {s.labels["model"] for s in hit.samples} == {"cached"}  # only models with the cache on
    assert [s.value for s in miss.samples if s.name.endswith("_count")] == [1]
    assert [s.value for s in miss.samples if s.name.endswith("_sum")] == [40]
    request = fams["nv_inference_request_summary_us"]
    assert {s.labels["model"] for s in request.samples} == {"plain"}  # Triton's FIXME DLIS-4762
    queue = fams["nv_inference_queue_summary_us"]
    assert {s.labels["model"] for s in queue.samples} == {"cached", "plain"}


def test_no_cache_summaries_without_summary_latencies():
    text = render_metrics(_registry(), system=False).decode()
    assert "_summary_per_model" not in text
    assert "nv_cache_num_hits_per_model{" in text


def test_cache_counters_go_with_counter_latencies_false():
    text = render_metrics(_registry(counters=False, summaries=True), system=False).decode()
    assert "_per_model{" not in text.replace("_summary_per_model", "")  # no nv_cache_*_per_model counter
    assert "nv_cache_hit_summary_per_model_count" in text


def test_pinned_memory_pool_gauges():
    fams = _families(render_metrics(StatsRegistry(), extra=lambda: ExtraMetrics(pinned_pool_bytes=1000),
                                    system=False))
    total, used = fams["nv_pinned_memory_pool_total_bytes"], fams["nv_pinned_memory_pool_used_bytes"]
    assert total.type == used.type == "gauge"
    assert total.documentation == "Pinned memory pool total memory size, in bytes"
    assert [(s.labels, s.value) for s in total.samples] == [({}, 1000)]
    assert [(s.labels, s.value) for s in used.samples] == [({}, 0)]
    assert b"pinned" not in render_metrics(StatsRegistry(), system=False)  # (not given: not written)
