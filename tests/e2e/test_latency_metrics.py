"""--metrics-config summary_latencies=true: the nv_inference_*_summary_us summaries on /metrics (a plain
and a decoupled Python model), counter_latencies=false, and none of them without the flags. Runs against
tritonserver 2.51 too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import math
import queue
import re

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

MODELS = ["identity_fp32", "decoupled_repeat"]
SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")
DURATION_COUNTERS = ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                     "nv_inference_compute_output_duration_us")
LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
IDENTITY_REQUESTS = 4
STREAM_REQUESTS = (3, 1, 2)


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m and not line.startswith("#"):
            out.append((m.group("name"), dict(LABEL.findall(m.group("labels") or "")), float(m.group("value"))))
    return out


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _value(samples, name: str, **labels: str) -> float:
    found = [v for n, lab, v in samples if n == name and lab == labels]
    assert len(found) == 1, (name, labels)
    return found[0]


def _drive(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(IDENTITY_REQUESTS):
        x = httpclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(np.ones(4, np.float32))
        client.infer("identity_fp32", [x])
    client.close()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: results.put((result, error)))
    for n in STREAM_REQUESTS:
        x = grpcclient.InferInput("IN", [1], "INT32")
        x.set_data_from_numpy(np.array([n], np.int32))
        grpc.async_stream_infer("decoupled_repeat", [x], enable_empty_final_response=True)
    finals = 0
    while finals < len(STREAM_REQUESTS):
        result, error = results.get(timeout=30)
        assert error is None, error
        params = result.get_response(as_json=True).get("parameters", {})
        if params.get("triton_final_response", {}).get("bool_param"):
            finals += 1
    grpc.stop_stream()
    grpc.close()


def test_summaries_after_requests(server_factory):
    server = server_factory(MODELS, extra_args=["--metrics-config", "summary_latencies=true"])
    before = server.metrics()
    types = _types(before)
    for name in SUMMARIES:
        assert types.get(name) == "summary", name
    samples = _samples(before)
    for model in MODELS:  # present from the start, empty
        assert _value(samples, "nv_inference_request_summary_us_count", model=model, version="1") == 0
        assert math.isnan(_value(samples, "nv_inference_request_summary_us", model=model, version="1",
                                 quantile="0.5"))

    _drive(server)
    text = server.metrics()
    samples = _samples(text)
    for model, count in (("identity_fp32", IDENTITY_REQUESTS), ("decoupled_repeat", len(STREAM_REQUESTS))):
        labels = {"model": model, "version": "1"}
        for name in SUMMARIES:
            assert _value(samples, f"{name}_count", **labels) == count, (name, model)
            assert _value(samples, f"{name}_sum", **labels) >= 0
            quantiles = [(lab["quantile"], v) for n, lab, v in samples
                         if n == name and lab.get("model") == model and "quantile" in lab]
            assert [q for q, _ in quantiles] == ["0.5", "0.9", "0.95", "0.99", "0.999"]
            values = [v for _, v in quantiles]
            assert all(v >= 0 for v in values), (name, values)
            assert values == sorted(values)
        # the request summary's quantiles lie within the requests' durations
        total = _value(samples, "nv_inference_request_summary_us_sum", **labels)
        assert 0 < _value(samples, "nv_inference_request_summary_us", quantile="0.999", **labels) <= total
        # the cumulative counters are still there (counter_latencies defaults to true)
        assert _value(samples, "nv_inference_request_duration_us", **labels) > 0


def test_custom_quantiles_without_counters(server_factory):
    server = server_factory(["identity_fp32"], extra_args=[
        "--metrics-config", "summary_latencies=true", "--metrics-config", "counter_latencies=false",
        "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001"])
    text = server.metrics()
    types = _types(text)
    for name in DURATION_COUNTERS:
        assert name not in types, name
    assert types["nv_inference_request_success"] == "counter"
    quantiles = [lab["quantile"] for n, lab, _ in _samples(text) if n == "nv_inference_queue_summary_us"]
    assert quantiles == ["0.5", "0.99"]


def test_no_summaries_without_the_flag(server_factory):
    server = server_factory(MODELS, extra_args=["--metrics-config", "no_such_setting=1"])  # ignored, as Triton does
    _drive(server)
    text = server.metrics()
    assert "_summary_us" not in text
    assert "nv_inference_first_response_histogram_ms" not in text
    assert _types(text)["nv_inference_request_duration_us"] == "counter"
