"""Load reports (issue 43 item 6): the `endpoint-load-metrics` response header (ORCA) that Triton sends
since 2.57 on its generate endpoints when a request asks with `endpoint-load-metrics-format: text|json`,
from TensorRT-LLM's nv_trt_llm_kv_cache_block_metrics gauges (here exported by a Python model,
kv_cache_report: 100 blocks of 64 tokens, 25 used until a request says otherwise). Triton 2.51 has no load
reports, so these are inferd-only; the header's format is Triton's (src/orca_http.cc)."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

pytestmark = pytest.mark.inferd_only  # Triton 2.57 added the endpoint-load-metrics header

MODEL, OTHER = "kv_cache_report", "gen_echo"
ASK, REPORT = "endpoint-load-metrics-format", "endpoint-load-metrics"


def post(server, path: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def generate(server, fmt: str | None, model: str = MODEL, stream: bool = False, **inputs) -> tuple[int, dict, bytes]:
    path = f"/v2/models/{model}/generate" + ("_stream" if stream else "")
    return post(server, path, {"text_input": "hi", **inputs}, {ASK: fmt} if fmt is not None else None)


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory([MODEL, OTHER])


def test_json_and_text_reports_on_generate(server):
    status, headers, body = generate(server, "json")
    assert status == 200 and json.loads(body)["text_output"] == "HI"
    assert headers[REPORT] == 'JSON {"named_metrics":{"kv_cache_utilization":0.25,"max_token_capacity":6400}}'
    status, headers, _ = generate(server, "text")
    assert status == 200
    assert headers[REPORT] == "TEXT named_metrics.kv_cache_utilization=0.250000, named_metrics.max_token_capacity=6400"


def test_report_on_generate_stream(server):
    status, headers, body = generate(server, "json", stream=True)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.startswith(b"data: ")
    doc = json.loads(headers[REPORT].removeprefix("JSON "))
    assert doc == {"named_metrics": {"kv_cache_utilization": 0.25, "max_token_capacity": 6400}}


def test_report_reads_the_gauges_as_they_are_at_the_answer(server):
    try:
        status, headers, _ = generate(server, "text", USED=80)  # the model sets "used" before it answers
        assert status == 200
        assert headers[REPORT].startswith("TEXT named_metrics.kv_cache_utilization=0.800000,")
    finally:
        generate(server, None, USED=25)


def test_no_report_unless_asked_in_a_known_format(server):
    for fmt in (None, "xml", "JSON", ""):
        status, headers, _ = generate(server, fmt)
        assert status == 200 and REPORT not in headers, fmt


def test_no_report_with_a_refused_request(server):
    status, headers, body = post(server, f"/v2/models/{MODEL}/generate", {"nope": 1}, {ASK: "json"})
    assert status == 400 and REPORT not in headers, body
    status, headers, _ = post(server, "/v2/models/missing/generate", {"text_input": "x"}, {ASK: "json"})
    assert status == 404 and REPORT not in headers


def test_as_triton_only_the_generate_endpoints_report(server):
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    status, headers, _ = post(server, f"/v2/models/{MODEL}/infer", body, {ASK: "json"})
    assert status == 200 and REPORT not in headers
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("text_input", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
        result = client.infer(MODEL, [x], headers={ASK: "json"}, client_timeout=30)
        assert result.as_numpy("text_output")[0] == b"HI"  # answered; gRPC carries no load report in Triton
    finally:
        client.close()


def test_any_models_request_gets_the_servers_kv_report(server):
    # as Triton, which reads the figures from its whole /metrics: another model's request reports them too
    status, headers, _ = generate(server, "json", model=OTHER)
    assert status == 200 and json.loads(headers[REPORT].removeprefix("JSON "))["named_metrics"][
        "max_token_capacity"] == 6400


def test_no_report_without_kv_cache_gauges(server_factory):
    server = server_factory([OTHER])
    status, headers, _ = generate(server, "json", model=OTHER)
    assert status == 200 and REPORT not in headers
    assert "no model exports the nv_trt_llm_kv_cache_block_metrics gauges" in server.log()


def test_report_through_frontend_processes(server_factory):
    server = server_factory([MODEL], inferd_args=["--frontend-processes", "2"])
    for _ in range(4):  # (whichever process takes the connection)
        status, headers, _ = generate(server, "text", stream=True)
        assert status == 200
        assert headers[REPORT] == \
            "TEXT named_metrics.kv_cache_utilization=0.250000, named_metrics.max_token_capacity=6400"
