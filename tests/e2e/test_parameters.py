"""Request parameters, request id, correlation id and sequence flags reach the model (`params`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

PROTOCOLS = ["http", "grpc"]
CUSTOM = {"alpha": "x", "beta": 7, "gamma": True, "delta": 2.5}


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(["params"])


def run(server, protocol: str, **kw):
    mod = httpclient if protocol == "http" else grpcclient
    inp = mod.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([5], dtype=np.int32))
    if protocol == "http":
        client = server.http_client()
    else:
        client = server.grpc_client()
        kw["client_timeout"] = 30
    try:
        result = client.infer("params", [inp], **kw)
    finally:
        client.close()
    assert result.as_numpy("OUTPUT0").tolist() == [5]
    return {
        "params": json.loads(result.as_numpy("PARAMS")[0]),
        "correlation_id": result.as_numpy("CORRELATION_ID")[0].decode(),
        "flags": int(result.as_numpy("FLAGS")[0]),
        "request_id": result.as_numpy("REQUEST_ID")[0].decode(),
        "response": result.get_response(),
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_custom_parameters_reach_the_model(server, protocol):
    got = run(server, protocol, parameters=CUSTOM)
    assert got["params"] == CUSTOM


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_parameters(server, protocol):
    got = run(server, protocol)
    assert got["params"] == {}
    assert got["correlation_id"] == "0"
    assert got["flags"] == 0
    assert got["request_id"] == ""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_id_echoed(server, protocol):
    got = run(server, protocol, request_id="req-123")
    assert got["request_id"] == "req-123"
    response = got["response"]
    assert (response["id"] if protocol == "http" else response.id) == "req-123"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sequence_id_and_flags(server, protocol):
    got = run(server, protocol, sequence_id=42, sequence_start=True)
    assert (got["correlation_id"], got["flags"]) == ("42", 1)
    got = run(server, protocol, sequence_id="abc", sequence_end=True)
    assert (got["correlation_id"], got["flags"]) == ("abc", 2)
    got = run(server, protocol, sequence_id=7, sequence_start=True, sequence_end=True)
    assert (got["correlation_id"], got["flags"]) == ("7", 3)
    # reserved parameters are not passed to the model as custom parameters
    assert got["params"] == {}


def test_http_reserved_parameter_prefix_rejected(server):
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}],
        "parameters": {"triton_anything": 1},
    }
    status, reply = server.post("/v2/models/params/infer", json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
    assert status == 400
    assert "error" in json.loads(reply)


def test_http_json_request_without_client(server):
    body = {
        "id": "raw-1",
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [9]}],
        "parameters": {"k": "v"},
        "outputs": [{"name": "OUTPUT0"}, {"name": "PARAMS"}],
    }
    status, reply = server.post("/v2/models/params/infer", json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
    assert status == 200, reply
    doc = json.loads(reply)
    assert doc["id"] == "raw-1"
    assert doc["model_name"] == "params"
    assert doc["model_version"] == "1"
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert set(outputs) == {"OUTPUT0", "PARAMS"}
    assert outputs["OUTPUT0"] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1], "data": [9]}
    assert json.loads(outputs["PARAMS"]["data"][0]) == {"k": "v"}


def test_binary_data_output_covers_only_outputs_not_listed(server):
    """Triton: binary_data_output applies when no outputs are listed; a listed output is binary only
    when its own binary_data says so."""
    base = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [9]}],
            "parameters": {"binary_data_output": True}}
    listed = dict(base, outputs=[{"name": "OUTPUT0"}, {"name": "FLAGS", "parameters": {"binary_data": True}}])
    status, reply = server.post("/v2/models/params/infer", json.dumps(listed).encode(),
                                headers={"Content-Type": "application/json"})
    assert status == 200, reply
    head = json.loads(reply[: reply.index(b"}]}") + 3])
    outputs = {o["name"]: o for o in head["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [9] and "parameters" not in outputs["OUTPUT0"]
    assert outputs["FLAGS"]["parameters"]["binary_data_size"] > 0
    status, reply = server.post("/v2/models/params/infer", json.dumps(base).encode(),
                                headers={"Content-Type": "application/json"})
    assert status == 200 and b'"binary_data_size"' in reply and b'"data"' not in reply
