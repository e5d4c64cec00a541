"""Statistics extension and Prometheus /metrics agree after a known number of requests."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ADD_SUB_OK = 5  # 3 over HTTP, 2 over gRPC
ERROR_OK = 3
ERROR_FAILED = 2
LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            labels = dict(LABEL.findall(m.group("labels") or ""))
            samples.append((m.group("name"), labels, float(m.group("value"))))
    return samples


def metric(samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]
    assert found, f"no sample {name}{labels}"
    return sum(found)


def http_inputs(model: str, value: int = 0):
    if model == "add_sub":
        inputs = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
        for inp in inputs:
            inp.set_data_from_numpy(np.ones(16, dtype=np.float32))
        return inputs
    inp = httpclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [inp]


@pytest.fixture(scope="module")
def server(module_server_factory):
    server = module_server_factory(["add_sub", "error"])
    http = server.http_client()
    grpc = server.grpc_client()
    try:
        for _ in range(3):
            http.infer("add_sub", http_inputs("add_sub"))
        for _ in range(2):
            inputs = [grpcclient.InferInput("INPUT0", [16], "FP32"), grpcclient.InferInput("INPUT1", [16], "FP32")]
            for inp in inputs:
                inp.set_data_from_numpy(np.ones(16, dtype=np.float32))
            grpc.infer("add_sub", inputs, client_timeout=30)
        for _ in range(ERROR_OK):
            http.infer("error", http_inputs("error", 9))
        for _ in range(ERROR_FAILED):
            with pytest.raises(InferenceServerException):
                http.infer("error", http_inputs("error", 0))  # raises in execute
    finally:
        http.close()
        grpc.close()
    return server


def stats_of(server, model: str) -> dict:
    client = server.http_client()
    try:
        doc = client.get_inference_statistics(model)
    finally:
        client.close()
    assert len(doc["model_stats"]) == 1
    return doc["model_stats"][0]


def test_statistics_counts(server):
    def settled():
        s = stats_of(server, "add_sub")
        return s if s["inference_stats"]["success"]["count"] == ADD_SUB_OK else None

    s = server.wait_until(settled, timeout=5, what="add_sub statistics to count every request")
    assert s["name"] == "add_sub"
    assert s["version"] == "1"
    assert s["inference_count"] == ADD_SUB_OK
    assert s["execution_count"] == ADD_SUB_OK
    inf = s["inference_stats"]
    assert inf["fail"]["count"] == 0
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[key]["count"] == ADD_SUB_OK, key
    assert inf["compute_infer"]["ns"] > 0
    assert inf["success"]["ns"] >= inf["compute_infer"]["ns"]
    assert inf["cache_hit"] == {"count": 0, "ns": 0}
    now_ms = time.time() * 1000
    assert now_ms - 600_000 < s["last_inference"] <= now_ms + 1000


def test_statistics_failures(server):
    s = server.wait_until(lambda: (x := stats_of(server, "error"))["inference_stats"]["fail"]["count"]
                          == ERROR_FAILED and x, timeout=5, what="error model failures counted")
    assert s["inference_stats"]["success"]["count"] == ERROR_OK
    assert s["inference_count"] == ERROR_OK


def test_statistics_all_models_and_grpc(server):
    client = server.http_client()
    try:
        names = {m["name"] for m in client.get_inference_statistics()["model_stats"]}
    finally:
        client.close()
    assert {"add_sub", "error"} <= names
    grpc = server.grpc_client()
    try:
        g = grpc.get_inference_statistics("add_sub", client_timeout=10)
    finally:
        grpc.close()
    assert len(g.model_stats) == 1
    gs = g.model_stats[0]
    assert gs.name == "add_sub"
    assert gs.inference_count == ADD_SUB_OK
    assert gs.execution_count == ADD_SUB_OK
    assert gs.inference_stats.success.count == ADD_SUB_OK


def test_statistics_unknown_model(server):
    client = server.http_client()
    try:
        with pytest.raises(InferenceServerException) as err:
            client.get_inference_statistics("no_such_model")
    finally:
        client.close()
    assert "no_such_model" in err.value.message()


def test_metrics_match_statistics(server):
    stats = {m: stats_of(server, m) for m in ("add_sub", "error")}
    samples = parse_metrics(server.metrics())
    for model, s in stats.items():
        labels = {"model": model, "version": "1"}
        inf = s["inference_stats"]
        assert metric(samples, "nv_inference_request_success", **labels) == inf["success"]["count"]
        assert metric(samples, "nv_inference_request_failure", **labels) == inf["fail"]["count"]
        assert metric(samples, "nv_inference_count", **labels) == s["inference_count"]
        assert metric(samples, "nv_inference_pending_request_count", **labels) == 0
    add_sub = {"model": "add_sub", "version": "1"}
    assert metric(samples, "nv_inference_exec_count", **add_sub) == stats["add_sub"]["execution_count"]
    assert metric(samples, "nv_inference_request_duration_us", **add_sub) > 0
    assert metric(samples, "nv_inference_compute_infer_duration_us", **add_sub) > 0
    assert metric(samples, "nv_inference_queue_duration_us", **add_sub) >= 0
    # a model exception is a BACKEND failure
    assert metric(samples, "nv_inference_request_failure", model="error", version="1",
                  reason="BACKEND") == ERROR_FAILED


def test_metrics_exposition_format(server):
    text = server.metrics()
    for name, kind in [("nv_inference_request_success", "counter"), ("nv_inference_request_failure", "counter"),
                       ("nv_inference_count", "counter"), ("nv_inference_exec_count", "counter"),
                       ("nv_inference_request_duration_us", "counter"),
                       ("nv_inference_pending_request_count", "gauge")]:
        assert f"# TYPE {name} {kind}" in text, name
    reasons = {lab.get("reason") for n, lab, _ in parse_metrics(text)
               if n == "nv_inference_request_failure" and lab.get("model") == "add_sub"}
    assert {"REJECTED", "CANCELED", "BACKEND", "OTHER"} <= reasons


def test_inference_count_counts_batch_items(module_server_factory):
    import numpy as np
    import tritonclient.http as httpclient

    server = module_server_factory(["batched_double"])
    client = server.http_client()
    try:
        for batch in (3, 5):
            data = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
            inp = httpclient.InferInput("INPUT0", [batch, 4], "FP32")
            inp.set_data_from_numpy(data)
            out = client.infer("batched_double", [inp]).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, data * 2)
    finally:
        client.close()
    s = server.wait_until(lambda: (x := stats_of(server, "batched_double"))["execution_count"] == 2 and x,
                          timeout=5, what="two executions counted")
    assert s["inference_count"] == 8  # 3 + 5 batch items, as Triton counts them
    assert s["inference_stats"]["success"]["count"] == 2  # requests
