"""--metrics-config histogram_latencies=true: nv_inference_first_response_histogram_ms (Triton 2.52; for
models that are not decoupled too since Triton 2.65), what is observed when, the model_metrics buckets,
and the text prometheus-cpp writes for it."""

from __future__ import annotations

import logging
import time

import pytest
from inferd.supervisor.core.streaming import ResponseStream
from inferd.supervisor.inference.types import InferResponse
from inferd.supervisor.metrics import latency_histogram as lh
from inferd.supervisor.metrics.endpoint import render_metrics
from inferd.supervisor.metrics.latency_summary import LatencyMetricsConfig
from inferd.supervisor.metrics.model_statistics import StatsRegistry
from inferd.worker.wire.errors import ErrorCode, InferdError
from prometheus_client.parser import text_string_to_metric_families

MS = 1_000_000
NAME = "nv_inference_first_response_histogram_ms"


def _registry(histograms: bool = True) -> StatsRegistry:
    return StatsRegistry(LatencyMetricsConfig(histograms=histograms))


def _buckets(text: bytes, **labels: str) -> dict[str, float]:
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    fam = fams[NAME]
    assert fam.type == "histogram"
    return {s.labels["le"]: s.value for s in fam.samples
            if s.name == NAME + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items())}


def test_observations_fall_in_prometheus_buckets():
    h = lh.Histogram()
    for ms in (0, 100, 101, 500, 4999, 5000, 5001):
        h.observe_ns(ms * MS + MS - 1)  # whole milliseconds, as Triton's ns / 1e6
    assert h.bounds == (100.0, 500.0, 2000.0, 5000.0)
    assert h.counts == [2, 2, 0, 2, 1]  # le=100: 0, 100; le=500: 101, 500; le=5000: 4999, 5000; +Inf: 5001
    assert h.count == 7 and h.total == 0 + 100 + 101 + 500 + 4999 + 5000 + 5001


def test_not_decoupled_observes_each_answered_request():
    reg = _registry()
    s = reg.get("m", 1)
    reg.configure(s, decoupled=False, cache_enabled=False)
    s.record_success(1, 3 * MS)
    s.record_successes([0, 0], 7 * MS, 150 * MS, 0, 0, 0)  # a batch of two, answered at 150 ms
    s.record_failure("BACKEND", 600 * MS)  # an error response is a response
    s.record_failure("REJECTED", 0)  # refused before it was queued: no response, as in Triton
    s.record_cache_hit(10, request_ns=1 * MS)
    assert s.first_response is not None
    assert s.first_response.count == 5
    assert s.first_response.counts == [2, 2, 1, 0, 0]


def test_decoupled_observes_the_first_response_of_its_stream_only():
    reg = _registry()
    s = reg.get("d", 1)
    reg.configure(s, decoupled=True, cache_enabled=False)
    s.record_success(1, 3_000 * MS)  # the execution's end is not the first response
    s.record_failure("BACKEND", 3_000 * MS)
    assert s.first_response is not None and s.first_response.count == 0
    stream = ResponseStream()
    stream.first_response = (s.first_response, time.monotonic_ns() - 6_000 * MS)  # arrived 6 s ago
    stream.put(InferResponse("d", "1"), False)
    stream.put(InferResponse("d", "1"), True)
    assert s.first_response.count == 1 and s.first_response.counts[-1] == 1
    failed = ResponseStream()
    failed.first_response = (s.first_response, time.monotonic_ns())
    failed.fail(InferdError(ErrorCode.UNAVAILABLE, "timed out"))  # a queue timeout's error response is its first
    assert s.first_response.count == 2


def test_off_without_the_flag():
    reg = _registry(histograms=False)
    s = reg.get("m", 1)
    reg.configure(s, decoupled=False, cache_enabled=False, buckets={NAME: (1.0,)})
    s.record_success(1, MS)
    assert s.first_response is None
    assert NAME.encode() not in render_metrics(reg, system=False)


def test_rendered_as_prometheus_cpp_writes_a_histogram():
    reg = _registry()
    a = reg.get("a", 1)
    reg.configure(a, decoupled=False, cache_enabled=False)
    a.metric_tags = (("team", "x"),)
    for ms in (5, 700, 6000):
        a.record_success(1, ms * MS)
    b = reg.get("b", 1)
    reg.configure(b, decoupled=False, cache_enabled=False, buckets={NAME: (1.0, 2.5, 4.0)})
    text = render_metrics(reg, system=False)
    lines = [ln for ln in text.decode().splitlines() if ln.startswith(NAME)]
    assert lines[:7] == [
        f'{NAME}_count{{_team="x",model="a",version="1"}} 3',
        f'{NAME}_sum{{_team="x",model="a",version="1"}} 6705',
        f'{NAME}_bucket{{_team="x",model="a",version="1",le="100"}} 1',
        f'{NAME}_bucket{{_team="x",model="a",version="1",le="500"}} 1',
        f'{NAME}_bucket{{_team="x",model="a",version="1",le="2000"}} 2',
        f'{NAME}_bucket{{_team="x",model="a",version="1",le="5000"}} 2',
        f'{NAME}_bucket{{_team="x",model="a",version="1",le="+Inf"}} 3',
    ]
    assert "# HELP nv_inference_first_response_histogram_ms Duration from request to first response in " \
           "milliseconds" in text.decode()
    assert _buckets(text, model="b") == {"1": 0, "2.5": 0, "4": 0, "+Inf": 0}


def test_model_metrics_buckets_and_their_checks(caplog):
    config = {"model_metrics": {"metric_control": [
        {"metric_identifier": {"family": NAME}, "histogram_options": {"buckets": [1, 2, 4, 8]}},
        {"metric_identifier": {"family": "nv_inference_queue_summary_us"}, "histogram_options": {"buckets": [1]}},
    ]}}
    with caplog.at_level(logging.WARNING, logger="inferd.metrics"):
        assert lh.bucket_overrides(config, "m") == {NAME: (1.0, 2.0, 4.0, 8.0)}
    assert "'nv_inference_queue_summary_us' in 'metric_identifier' is not a customizable metric" in caplog.text
    assert lh.bucket_overrides({}, "m") == {}
    for bad in ([2, 1], [1, 1], [1, float("inf")], [float("nan")]):
        with pytest.raises(InferdError, match="must be finite and in increasing order"):
            lh.bucket_overrides({"model_metrics": {"metric_control": [
                {"metric_identifier": {"family": NAME}, "histogram_options": {"buckets": bad}}]}}, "m")


def test_a_reloaded_version_keeps_its_histogram():
    reg = _registry()
    s = reg.get("m", 1)
    reg.configure(s, decoupled=False, cache_enabled=False, buckets={NAME: (1.0,)})
    s.record_success(1, MS)
    reg.configure(reg.get("m", 1), decoupled=False, cache_enabled=False, buckets={NAME: (9.0,)})
    assert s.first_response is not None and s.first_response.bounds == (1.0,) and s.first_response.count == 1
    reg.remove("m", 1)  # unloaded: loaded again, it takes the new buckets (as Triton)
    t = reg.get("m", 1)
    reg.configure(t, decoupled=False, cache_enabled=False, buckets={NAME: (9.0,)})
    assert t.first_response is not None and t.first_response.bounds == (9.0,)
