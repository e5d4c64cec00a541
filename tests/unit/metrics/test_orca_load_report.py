"""http_api/orca.py: the endpoint-load-metrics header (ORCA, Triton 2.57 and later, its src/orca_http.cc) from the
nv_trt_llm_kv_cache_block_metrics gauges the models export, as the supervisor's custom metrics hold them."""

from __future__ import annotations

import json

from inferd.supervisor.http_api import orca
from inferd.supervisor.metrics.custom import CustomMetrics
from inferd.worker.wire import metric_rules as rules
from inferd.worker.wire.messages import MetricsReport

KV = "nv_trt_llm_kv_cache_block_metrics"


def _metrics(model: str, worker: str = "w1", *, used: float = 25, max_blocks: float = 100, tokens: float = 64,
             reg: CustomMetrics | None = None) -> CustomMetrics:
    """A worker of `model` exporting the three gauges (TensorRT-LLM's labels: type, model, version)."""
    reg = reg or CustomMetrics()
    labels = [{orca.KV_TYPE_LABEL: t, "model": model, "version": "1"} for t in ("max", "used", "tokens_per")]
    reg.apply(worker, MetricsReport(families=[[1, KV, "KV cache blocks", rules.GAUGE]],
                                    metrics=[[10 + i, 1, lab, None] for i, lab in enumerate(labels)]))
    reg.apply(worker, MetricsReport(values=[[10, float(max_blocks), 1, 0.0, 0.0, 1], [11, float(used), 1, 0.0, 0.0, 1],
                                            [12, float(tokens), 1, 0.0, 0.0, 1]]))
    return reg


def test_json_and_text_as_triton_writes_them():
    reg = _metrics("llm")
    assert orca.load_report(reg, "json", "llm") == \
        'JSON {"named_metrics":{"kv_cache_utilization":0.25,"max_token_capacity":6400}}'
    assert orca.load_report(reg, "text", "llm") == \
        "TEXT named_metrics.kv_cache_utilization=0.250000, named_metrics.max_token_capacity=6400"
    doc = json.loads(orca.load_report(reg, "json", "other").removeprefix("JSON "))  # (any model's figures)
    assert doc == {"named_metrics": {"kv_cache_utilization": 0.25, "max_token_capacity": 6400}}


def test_figures_whose_product_overflows_send_no_header():
    # (each gauge finite, max x tokens_per infinite: int() of it raised OverflowError, a 500 for the request)
    reg = _metrics("llm", used=1e300, max_blocks=1e200, tokens=1e200)
    assert orca.load_report(reg, "json", "llm") is None
    reg = _metrics("llm", used=1e300, max_blocks=1e-20, tokens=1)  # used / max overflows
    assert orca.load_report(reg, "text", "llm") is None


def test_doubles_as_rapidjson_writes_them():
    assert orca.header_value("json", 0.0, 0) == \
        'JSON {"named_metrics":{"kv_cache_utilization":0.0,"max_token_capacity":0}}'
    assert '"kv_cache_utilization":1e-5,' in orca.header_value("json", 1e-5, 1)
    assert '"kv_cache_utilization":0.3333333333333333,' in orca.header_value("json", 1 / 3, 1)
    assert orca.header_value("text", 1 / 3, 7.9) == \
        "TEXT named_metrics.kv_cache_utilization=0.333333, named_metrics.max_token_capacity=7"


def test_no_report_without_the_three_figures_or_in_another_format(caplog):
    assert orca.load_report(CustomMetrics(), "json", "m") is None
    reg = CustomMetrics()
    reg.apply("w", MetricsReport(families=[[1, KV, "d", rules.GAUGE]],
                                 metrics=[[10, 1, {orca.KV_TYPE_LABEL: "max"}, None],
                                          [11, 1, {orca.KV_TYPE_LABEL: "used"}, None]]))
    assert orca.load_report(reg, "json", "m") is None  # no tokens_per
    assert orca.load_report(_metrics("m"), "xml", "m") is None
    assert orca.load_report(_metrics("m"), "JSON", "m") is None  # (Triton compares the value as it is)
    assert "no model exports the nv_trt_llm_kv_cache_block_metrics gauges" in caplog.text
    assert "'xml' is not a load report format" in caplog.text


def test_zero_blocks_is_zero_utilization():
    assert orca.load_report(_metrics("m", used=5, max_blocks=0), "text", "m") == \
        "TEXT named_metrics.kv_cache_utilization=0.000000, named_metrics.max_token_capacity=0"


def test_the_requested_models_figures_first():
    reg = _metrics("a", "w1", used=10, max_blocks=100, tokens=16)
    _metrics("b", "w2", used=90, max_blocks=100, tokens=32, reg=reg)
    assert orca.load_report(reg, "text", "a").endswith("=0.100000, named_metrics.max_token_capacity=1600")
    assert orca.load_report(reg, "text", "b").endswith("=0.900000, named_metrics.max_token_capacity=3200")
    assert orca.load_report(reg, "text", "c").endswith("=0.900000, named_metrics.max_token_capacity=3200")  # last


def test_samples_of_a_family():
    reg = _metrics("m")
    samples = reg.samples(KV)
    assert sorted(v for _, v in samples) == [25, 64, 100]
    assert all(lab["model"] == "m" for lab, _ in samples)
    assert reg.samples("nope") == []
