"""tritonserver's --http-restricted-api / --grpc-restricted-protocol and --http-header-forward-pattern /
--grpc-header-forward-pattern, with unmodified tritonclient (`headers=`), on both gRPC servers.

The expectations were read off Triton 2.51 (these tests pass against it: INFERD_E2E_TARGET=triton):
a restricted HTTP API answers 403 `This API is restricted, expecting header '<key>'` (header name in
any case, value exact); a restricted gRPC call gets UNAVAILABLE `This protocol is restricted,
expecting header 'triton-grpc-protocol-<key>'` and passes with that metadata key. Forwarded headers
reach the model (`params` echoes request.parameters()) as string parameters, after the request's own.
HTTP health stays open here: the fixtures wait on it.
"""

from __future__ import annotations

import http.client
import json
import queue

import grpc as grpcio
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ADMIN = {"admin-key": "s3cret"}
INFER = {"infer-key": "go"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "go"}
HTTP_REFUSED_ADMIN = "This API is restricted, expecting header 'admin-key'"
HTTP_REFUSED_INFER = "This API is restricted, expecting header 'infer-key'"
GRPC_REFUSED_ADMIN = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
GRPC_REFUSED_INFER = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"

FLAGS = [
    "--http-restricted-api=model-repository,shared-memory:admin-key=s3cret",
    "--http-restricted-api=inference:infer-key=go",
    "--grpc-restricted-protocol=model-repository,health:admin-key=s3cret",
    "--grpc-restricted-protocol=inference:infer-key=go",
    "--http-header-forward-pattern=x-fw.*",
    "--grpc-header-forward-pattern=x-fw.*",
]


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(["params"], extra_args=FLAGS)


@pytest.fixture(scope="module")
def grpcio_server(module_server_factory):
    return module_server_factory(["params"], extra_args=FLAGS, inferd_args=["--grpc-server", "grpcio"])


@pytest.fixture(params=["native", "grpcio"])
def grpc_server(request, server, grpcio_server):
    return server if request.param == "native" else grpcio_server


@pytest.fixture(scope="module")
def hc(server):
    client = server.http_client()
    yield client
    client.close()


def _refused(call, status: str, message: str) -> None:
    with pytest.raises(InferenceServerException) as err:
        call()
    assert str(err.value.status()) == status, err.value
    assert message in str(err.value)


def _inputs(mod):
    inp = mod.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([5], dtype=np.int32))
    return [inp]


def _params(result) -> dict:
    assert result.as_numpy("OUTPUT0").tolist() == [5]
    return json.loads(result.as_numpy("PARAMS")[0])


def _raw(server, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


# ------------------------------------------------------------------ HTTP


def test_http_restricted_category_refused_without_or_with_a_wrong_header(server, hc):
    _refused(hc.get_model_repository_index, "403", HTTP_REFUSED_ADMIN)
    _refused(lambda: hc.get_model_repository_index(headers={"admin-key": "wrong"}), "403", HTTP_REFUSED_ADMIN)
    _refused(lambda: hc.get_model_repository_index(headers={"admin-key": "S3CRET"}), "403", HTTP_REFUSED_ADMIN)
    _refused(lambda: hc.unload_model("params"), "403", HTTP_REFUSED_ADMIN)
    _refused(hc.get_system_shared_memory_status, "403", HTTP_REFUSED_ADMIN)
    _refused(lambda: hc.infer("params", _inputs(httpclient)), "403", HTTP_REFUSED_INFER)
    _refused(lambda: hc.infer("params", _inputs(httpclient), headers=ADMIN), "403", HTTP_REFUSED_INFER)
    # the body as Triton sends it, before the method or the model are looked at
    status, ctype, body = _raw(server, "GET", "/v2/repository/index", {})
    assert (status, json.loads(body)) == (403, {"error": HTTP_REFUSED_ADMIN})
    assert ctype.startswith("text/plain")
    status, _, body = _raw(server, "POST", "/v2/models/nope/generate", {})
    assert (status, json.loads(body)) == (403, {"error": HTTP_REFUSED_INFER})


def test_http_restricted_category_allowed_with_the_header(server, hc):
    index = hc.get_model_repository_index(headers=ADMIN)
    assert [m["name"] for m in index] == ["params"]
    assert hc.get_system_shared_memory_status(headers={"Admin-Key": "s3cret"}) == []  # any case of the name
    result = hc.infer("params", _inputs(httpclient), headers=INFER)
    assert _params(result) == {}


def test_http_other_categories_and_metrics_stay_open(server, hc):
    assert hc.is_server_live() and hc.is_server_ready() and hc.is_model_ready("params")
    assert hc.get_server_metadata()["name"] == "triton"
    assert hc.get_model_metadata("params")["name"] == "params"
    assert hc.get_model_config("params")["name"] == "params"
    assert hc.get_inference_statistics("params")["model_stats"][0]["name"] == "params"
    assert "log_info" in hc.get_log_settings()
    assert "nv_inference_request_success" in server.metrics()


def test_http_headers_forwarded_to_the_model(server, hc):
    headers = dict(INFER, **{"X-Fw-Alpha": "One", "x-fwb": "two", "my-x-fw": "3", "other": "4", "x-fw-num": "9"})
    result = hc.infer("params", _inputs(httpclient), headers=headers, parameters={"x-fw-num": 7, "keep": "k"})
    # names as sent, matched anywhere in the name and in any case; a header wins over a request
    # parameter of its name (Triton appends it after the request's own)
    assert _params(result) == {"keep": "k", "X-Fw-Alpha": "One", "x-fwb": "two", "my-x-fw": "3", "x-fw-num": "9"}


def test_http_generate_gets_no_forwarded_headers(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/params/generate", body=json.dumps({"INPUT0": [5]}),
                     headers=dict(INFER, **{"x-fw-a": "1", "Content-Type": "application/json"}))
        resp = conn.getresponse()
        doc = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 200, doc
    assert json.loads(doc["PARAMS"]) == {}


# ------------------------------------------------------------------ gRPC (native and grpcio)


def test_grpc_restricted_protocol(grpc_server):
    client = grpc_server.grpc_client()
    try:
        for call in (client.is_server_live, client.is_server_ready, lambda: client.is_model_ready("params"),
                     client.get_model_repository_index,
                     lambda: client.is_server_live(headers={"admin-key": "s3cret"}),  # needs the prefix
                     lambda: client.is_server_live(headers={"triton-grpc-protocol-admin-key": "wrong"})):
            _refused(call, "StatusCode.UNAVAILABLE", GRPC_REFUSED_ADMIN)
        assert client.is_server_live(headers=GRPC_ADMIN) and client.is_model_ready("params", headers=GRPC_ADMIN)
        assert [m.name for m in client.get_model_repository_index(headers=GRPC_ADMIN).models] == ["params"]
        # other categories stay open
        assert client.get_server_metadata().name == "triton"
        assert client.get_model_config("params").config.name == "params"
        assert client.get_system_shared_memory_status().regions == {}
        _refused(lambda: client.infer("params", _inputs(grpcclient), client_timeout=30),
                 "StatusCode.UNAVAILABLE", GRPC_REFUSED_INFER)
        headers = dict(GRPC_INFER, **{"x-fw-a": "1", "x-fwb": "2", "my-x-fw": "3", "other": "4"})
        result = client.infer("params", _inputs(grpcclient), headers=headers, parameters={"keep": "k"},
                              client_timeout=30)
        assert _params(result) == {"keep": "k", "x-fw-a": "1", "x-fwb": "2", "my-x-fw": "3"}
    finally:
        client.close()


def test_grpc_health_service_is_health(grpc_server):
    with grpcio.insecure_channel(grpc_server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpcio.RpcError) as err:
            check(b"", timeout=30)
        assert err.value.code() == grpcio.StatusCode.UNAVAILABLE
        assert err.value.details() == GRPC_REFUSED_ADMIN
        assert check(b"", metadata=tuple(GRPC_ADMIN.items()), timeout=30) == b"\x08\x01"  # SERVING


def _stream(grpc_server, headers: dict[str, str] | None):
    results: queue.Queue = queue.Queue()
    client = grpc_server.grpc_client()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
        try:
            client.async_stream_infer("params", _inputs(grpcclient))
        except InferenceServerException:
            pass  # the stream was refused already: the callback has the reason
        return results.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()


def test_grpc_stream_restricted_and_forwarded(grpc_server):
    result, error = _stream(grpc_server, None)
    assert result is None and GRPC_REFUSED_INFER in str(error)
    result, error = _stream(grpc_server, dict(GRPC_INFER, **{"x-fw-s": "st"}))
    assert error is None, error
    assert _params(result) == {"x-fw-s": "st"}


def test_infer_ctl_sends_the_restricted_key(server_factory):
    """infer-ctl --header reaches a restricted model-repository API."""
    import subprocess
    import sys
    from pathlib import Path

    server = server_factory(["identity_fp32"], extra_args=["--http-restricted-api", "model-repository:ops-key=k1"])
    ctl = [str(Path(sys.executable).parent / "infer-ctl"), "--url", server.http_base, "index", "--json"]
    refused = subprocess.run(ctl, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "expecting header 'ops-key'" in refused.stderr, refused.stderr
    allowed = subprocess.run([*ctl, "--header", "ops-key=k1"], capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert "identity_fp32" in allowed.stdout
