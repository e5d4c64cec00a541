"""Latency summaries (--metrics-config summary_latencies=true): the windowed estimator, the
--metrics-config parser and the rendered summary families."""

from __future__ import annotations

import math

import pytest
from inferd.supervisor.flags import parse_args, parse_metrics_config
from inferd.supervisor.metrics import latency_summary as ls
from inferd.supervisor.metrics.endpoint import render_metrics
from inferd.supervisor.metrics.model_statistics import StatsRegistry
from prometheus_client.parser import text_string_to_metric_families

SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")


def _families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


# ---- estimator ----

def test_quantiles_exact_ranks():
    values = list(range(1, 101))  # 1..100
    assert ls.quantiles(values, [0.5, 0.9, 0.99, 0.999, 0.0, 1.0]) == [51, 91, 100, 100, 1, 100]
    assert ls.quantiles([7], [0.5, 0.99]) == [7, 7]
    assert all(math.isnan(v) for v in ls.quantiles([], [0.5, 0.9]))


def test_ring_is_bounded_and_windowed():
    ring = ls.LatencyRing(capacity=3, max_age_s=1.0)
    for t in range(10):
        ring.entries.append((1000 + t, t, 0, 0, 0, 0))
    assert [e[1] for e in ring.recent(now_ms=1009)] == [7, 8, 9]  # the newest 3
    assert [e[1] for e in ring.recent(now_ms=2008)] == [8, 9]  # older than 1 s: dropped
    assert ring.recent(now_ms=5000) == []
    assert len(ring.entries) == 0


def test_column_skips_missing():
    entries = [(0, 5, 1, 2, 3, 4), (0, 6, 1, None, None, None)]
    assert ls.column(entries, ls.REQUEST) == [5, 6]
    assert ls.column(entries, ls.COMPUTE_INFER) == [3]


# ---- --metrics-config ----

def test_parse_metrics_config_keys():
    cfg, notes = parse_metrics_config([])
    assert cfg == ls.LatencyMetricsConfig() and not cfg.summaries and cfg.counters and notes == []
    cfg, notes = parse_metrics_config(["summary_latencies=true", "counter_latencies=false",
                                       "summary_quantiles=0.5:0.05,0.99:0.001"])
    assert cfg.summaries and not cfg.counters
    assert cfg.quantiles == ((0.5, 0.05), (0.99, 0.001))
    assert notes == []
    cfg, notes = parse_metrics_config(["summary_latencies=true", "summary_latencies=false"])
    assert not cfg.summaries  # the last one wins


def test_parse_metrics_config_unknown_is_logged_not_fatal_and_histograms_turn_on():
    cfg, notes = parse_metrics_config(["foo=bar", "histogram_latencies=true"])
    assert cfg == ls.LatencyMetricsConfig(histograms=True)  # the first-response histogram (Triton 2.52)
    assert len(notes) == 1 and "foo=bar" in notes[0] and "unknown" in notes[0]
    cfg, _ = parse_metrics_config(["histogram_latencies=true", "histogram_latencies=false"])
    assert not cfg.histograms  # the last one wins


def test_parse_metrics_config_booleans_as_triton_reads_them():
    for value in ("TRUE", "1", "maybe"):  # tritonserver 2.51 starts with these and leaves summaries off
        cfg, notes = parse_metrics_config([f"summary_latencies={value}"])
        assert not cfg.summaries and len(notes) == 1
    cfg, notes = parse_metrics_config(["counter_latencies=0"])
    assert cfg.counters and len(notes) == 1


@pytest.mark.parametrize("value", ["summary_quantiles=0.5", "summary_quantiles=2:0.1", "summary_quantiles=abc",
                                   "summary_latencies", "=true"])
def test_parse_metrics_config_bad_values(value):
    with pytest.raises(ValueError):
        parse_metrics_config([value])


def test_server_flag(tmp_path):
    cfg = parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"),
                      "--metrics-config", "summary_latencies=true", "--metrics-config", "foo=1"])
    assert cfg.metrics_latency.summaries
    assert not any("--metrics-config" in line and "has no effect in inferd" in line for line in cfg.inert_flags)
    assert any("foo=1" in line for line in cfg.inert_flags)
    with pytest.raises(SystemExit):
        parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"),
                    "--metrics-config", "summary_quantiles=0.5"])


# ---- recording and rendering ----

def test_off_by_default_no_ring_no_families():
    reg = StatsRegistry()
    s = reg.get("m", 1)
    assert s.latency is None
    s.record_success(1, 5000, 1000, 100, 2000, 300)
    text = render_metrics(reg, system=False).decode()
    assert "summary" not in text
    assert "nv_inference_request_duration_us" in text


def test_summaries_render():
    reg = StatsRegistry(ls.LatencyMetricsConfig(summaries=True))
    s = reg.get("m", 1)
    s.metric_tags = (("team", "a"),)
    reg.get("idle", 1)
    for i in range(1, 11):
        s.record_success(1, i * 1000_000, i * 1000, 100_000, i * 10_000, 3000)
    s.record_cache_hit(5000, request_ns=50_000, queue_ns=2000)
    text = render_metrics(reg, system=False)
    fams = _families(text)
    for name in SUMMARIES:
        assert fams[name].type == "summary"
    req = {(x.name, x.labels.get("model"), x.labels.get("quantile")): x.value
           for x in fams["nv_inference_request_summary_us"].samples}
    assert req[("nv_inference_request_summary_us_count", "m", None)] == 11
    assert req[("nv_inference_request_summary_us_sum", "m", None)] == 55_050
    assert req[("nv_inference_request_summary_us", "m", "0.5")] == 5000
    assert req[("nv_inference_request_summary_us", "m", "0.999")] == 10_000
    assert req[("nv_inference_request_summary_us_count", "idle", None)] == 0
    assert math.isnan(req[("nv_inference_request_summary_us", "idle", "0.5")])
    infer = {(x.name, x.labels.get("model"), x.labels.get("quantile")): x.value
             for x in fams["nv_inference_compute_infer_summary_us"].samples}
    assert infer[("nv_inference_compute_infer_summary_us_count", "m", None)] == 10  # the cache hit is left out
    assert infer[("nv_inference_compute_infer_summary_us", "m", "0.9")] == 100
    # Triton's label layout: tags and model/version sorted, quantile last; default quantiles
    lines = text.decode().splitlines()
    assert ('nv_inference_queue_summary_us{_team="a",model="m",version="1",quantile="0.5"} 5' in lines)
    qs = [x.labels["quantile"] for x in fams["nv_inference_queue_summary_us"].samples
          if x.labels.get("model") == "m" and "quantile" in x.labels]
    assert qs == ["0.5", "0.9", "0.95", "0.99", "0.999"]


def test_custom_quantiles_and_no_counters():
    reg = StatsRegistry(ls.LatencyMetricsConfig(summaries=True, counters=False, quantiles=((0.25, 0.01),)))
    reg.get("m", 1).record_success(1, 4000, 2000, 0, 0, 0)
    fams = _families(render_metrics(reg, system=False))
    assert "nv_inference_request_duration_us" not in fams and "nv_inference_queue_duration_us" not in fams
    assert "nv_inference_request_success" in fams
    qs = [x.labels["quantile"] for x in fams["nv_inference_request_summary_us"].samples if "quantile" in x.labels]
    assert qs == ["0.25"]
