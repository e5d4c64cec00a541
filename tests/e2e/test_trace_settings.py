"""Trace settings as Triton 2.51 keeps them: per-model settings fall back to the global ones field by field,
a refused update changes nothing, Triton's error texts. Unmodified tritonclient, HTTP and gRPC; the same
file passes against the real Triton (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import json

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODELS = ["add_sub", "identity"]
DEFAULT = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
           "trace_file": "", "trace_mode": "triton"}
FILE_REFUSED = "trace file location can not be updated through network protocol"


@pytest.fixture
def server(server_factory):
    return server_factory(MODELS)  # one per test: settings are server state


def _grpc_settings(client: grpcclient.InferenceServerClient, model: str = "", **kw) -> dict:
    got = client.update_trace_settings(model_name=model, **kw) if kw else client.get_trace_settings(model_name=model)
    return {k: (list(v.value) if k == "trace_level" else v.value[0]) for k, v in got.settings.items()}


def test_model_settings_are_independent_and_fall_back_to_global(server):
    http = server.http_client()
    assert http.get_trace_settings() == DEFAULT
    assert http.update_trace_settings("add_sub", {"trace_rate": "5"}) == {**DEFAULT, "trace_rate": "5"}
    # the other model and the global settings are untouched
    assert http.get_trace_settings("identity") == DEFAULT
    assert http.get_trace_settings() == DEFAULT
    # a global change reaches every field a model did not set itself
    assert http.update_trace_settings(settings={"trace_count": "7", "trace_rate": "50"})["trace_rate"] == "50"
    assert http.get_trace_settings("add_sub") == {**DEFAULT, "trace_rate": "5", "trace_count": "7"}
    assert http.get_trace_settings("identity") == {**DEFAULT, "trace_rate": "50", "trace_count": "7"}
    # null clears a model's field: it follows the global one again
    assert http.update_trace_settings("add_sub", {"trace_rate": None})["trace_rate"] == "50"
    # null clears a global field: back to the default
    assert http.update_trace_settings(settings={"trace_rate": None}) == {**DEFAULT, "trace_count": "7"}
    assert http.get_trace_settings("add_sub") == {**DEFAULT, "trace_count": "7"}
    http.close()


@pytest.mark.parametrize("model", ["", "add_sub"])
def test_refused_update_changes_nothing(server, model):
    http = server.http_client()
    http.update_trace_settings(model, {"trace_count": "3"})
    before = (http.get_trace_settings(), http.get_trace_settings("add_sub"), http.get_trace_settings("identity"))
    for bad, text in (({"trace_rate": "9", "trace_file": "/tmp/x"}, FILE_REFUSED),
                      ({"trace_rate": "9", "trace_count": "-2"}, "Expecting value >= -1"),
                      ({"log_frequency": "9", "trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
                      ({"trace_rate": "9", "trace_level": ["TIMESTAMPS"]},
                       "Attempting to set invalid trace setting :trace file name is not given"),
                      ({"trace_rate": "9", "trace_level": ["OFF", "TENSORS"]},
                       "Expect only one trace level 'OFF' is specified")):
        with pytest.raises(InferenceServerException, match=text):
            http.update_trace_settings(model, bad)
    after = (http.get_trace_settings(), http.get_trace_settings("add_sub"), http.get_trace_settings("identity"))
    assert after == before
    http.close()


def test_trace_file_refused_with_tritons_status(server):
    code, body = server.post("/v2/trace/setting", json.dumps({"trace_file": ""}).encode())
    assert code == 501 and json.loads(body) == {"error": FILE_REFUSED}
    code, body = server.post("/v2/models/add_sub/trace/setting", json.dumps({"trace_file": "f"}).encode())
    assert code == 501 and json.loads(body) == {"error": FILE_REFUSED}
    grpc = server.grpc_client()
    with pytest.raises(InferenceServerException) as err:
        grpc.update_trace_settings(model_name="add_sub", settings={"trace_file": "f", "trace_rate": "2"})
    assert err.value.status() == "StatusCode.UNIMPLEMENTED" and err.value.message() == FILE_REFUSED
    assert _grpc_settings(grpc, "add_sub") == DEFAULT
    grpc.close()


def test_unknown_model(server):
    code, body = server.get("/v2/models/nosuch/trace/setting")
    assert code == 400 and json.loads(body) == {"error": "Request for unknown model : nosuch"}


def test_grpc_settings_per_model(server):
    grpc = server.grpc_client()
    assert _grpc_settings(grpc, "identity", settings={"trace_rate": "6"}) == {**DEFAULT, "trace_rate": "6"}
    assert _grpc_settings(grpc, "add_sub") == DEFAULT
    assert _grpc_settings(grpc) == DEFAULT
    with pytest.raises(InferenceServerException, match="expect only 1 value for 'trace_rate'"):
        grpc.update_trace_settings(model_name="identity", settings={"trace_rate": ["1", "2"]})
    # an empty value clears the field (as HTTP's null)
    assert _grpc_settings(grpc, "identity", settings={"trace_rate": None}) == DEFAULT
    grpc.close()
    # and HTTP sees what gRPC set
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.get_trace_settings("identity") == DEFAULT
    http.close()
