"""Exact error statuses and message texts, over HTTP and gRPC (Triton's wording).

HTTP status ↔ gRPC code: 400 ↔ INVALID_ARGUMENT, 404 ↔ NOT_FOUND, 500 ↔ INTERNAL, 503 ↔ UNAVAILABLE.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODELS = ["add_sub", "sleep", "error", "wrong_output"]
PROTOCOLS = ["http", "grpc"]
STATUS = {
    "http": {400: "400", 404: "404", 500: "500", 503: "503"},
    "grpc": {400: "StatusCode.INVALID_ARGUMENT", 404: "StatusCode.NOT_FOUND", 500: "StatusCode.INTERNAL",
             503: "StatusCode.UNAVAILABLE"},
}


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


@pytest.fixture(scope="module")
def clients(server):
    http = server.http_client()
    grpc = server.grpc_client()
    yield {"http": http, "grpc": grpc}
    http.close()
    grpc.close()


def make_input(protocol: str, name: str, data: np.ndarray, datatype: str):
    mod = httpclient if protocol == "http" else grpcclient
    inp = mod.InferInput(name, list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    return inp


def infer(clients, protocol: str, model: str, inputs, outputs=None, **kw):
    client = clients[protocol]
    if protocol == "grpc":
        kw.setdefault("client_timeout", 30)
    return client.infer(model, inputs, outputs=outputs, **kw)


def expect_error(protocol: str, status: int, fn, *fragments: str) -> str:
    with pytest.raises(InferenceServerException) as err:
        fn()
    assert err.value.status() == STATUS[protocol][status], (err.value.status(), err.value.message())
    message = err.value.message()
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def sleep_input(protocol: str, data=None, datatype: str = "FP32"):
    data = np.array([0.0], dtype=np.float32) if data is None else data
    return [make_input(protocol, "INPUT0", data, datatype)]


def add_sub_inputs(protocol: str, names=("INPUT0", "INPUT1")):
    return [make_input(protocol, n, np.ones(16, dtype=np.float32), "FP32") for n in names]


def error_infer(clients, protocol: str, value: int):
    inputs = [make_input(protocol, "INPUT0", np.array([value], dtype=np.int32), "INT32")]
    return infer(clients, protocol, "error", inputs)


# ---------------------------------------------------------------------------- unknown model / version


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model(clients, protocol):
    expect_error(protocol, 404, lambda: infer(clients, protocol, "no_such_model", sleep_input(protocol)),
                 "Request for unknown model: 'no_such_model' is not found")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_metadata(clients, protocol):
    kw = {"client_timeout": 10} if protocol == "grpc" else {}
    expect_error(protocol, 404, lambda: clients[protocol].get_model_metadata("no_such_model", **kw),
                 "Request for unknown model: 'no_such_model' is not found")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_version(clients, protocol):
    expect_error(protocol, 404,
                 lambda: infer(clients, protocol, "sleep", sleep_input(protocol), model_version="7"),
                 "'sleep'", "7")


# ---------------------------------------------------------------------------- request validation


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_datatype(clients, protocol):
    data = np.array([0], dtype=np.int32)
    expect_error(protocol, 400, lambda: infer(clients, protocol, "sleep", sleep_input(protocol, data, "INT32")),
                 "inference input 'INPUT0' data-type is 'INT32', but model 'sleep' expects 'FP32'")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_shape(clients, protocol):
    data = np.zeros(2, dtype=np.float32)
    expect_error(protocol, 400, lambda: infer(clients, protocol, "sleep", sleep_input(protocol, data)),
                 "unexpected shape for input 'INPUT0' for model 'sleep'. Expected [1], got [2]")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_missing_input(clients, protocol):
    expect_error(protocol, 400, lambda: infer(clients, protocol, "add_sub", add_sub_inputs(protocol, ["INPUT0"])),
                 "expected 2 inputs but got 1 inputs for model 'add_sub'", "['INPUT1']")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_input(clients, protocol):
    inputs = add_sub_inputs(protocol, ["INPUT0", "INPUT1", "BOGUS"])
    # Triton 2.51: "expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['BOGUS',...";
    # newer cores name the input first: "unexpected inference input 'BOGUS' for model 'add_sub'"
    expect_error(protocol, 400, lambda: infer(clients, protocol, "add_sub", inputs), "'add_sub'", "BOGUS")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_output(clients, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    outputs = [mod.InferRequestedOutput("NOPE")]
    expect_error(protocol, 400,
                 lambda: infer(clients, protocol, "add_sub", add_sub_inputs(protocol), outputs=outputs),
                 "unexpected inference output 'NOPE' for model 'add_sub'")


# ---------------------------------------------------------------------------- model errors


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_raises_triton_model_exception(clients, protocol):
    expect_error(protocol, 500, lambda: error_infer(clients, protocol, 0),
                 "Failed to process the request(s) for model '",
                 "TritonModelException: error model: deliberate exception in execute")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_raises_value_error(clients, protocol):
    expect_error(protocol, 500, lambda: error_infer(clients, protocol, 3),
                 "Failed to process the request(s) for model '",
                 "ValueError: error model: deliberate value error")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_response_error(clients, protocol):
    message = expect_error(protocol, 500, lambda: error_infer(clients, protocol, 1))
    assert message == "error model: deliberate response error"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_response_error_keeps_its_code(clients, protocol):
    message = expect_error(protocol, 400, lambda: error_infer(clients, protocol, 2))
    assert message == "error model: deliberate invalid argument"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_serves_after_errors(clients, protocol):
    for value in (0, 1, 3):
        with pytest.raises(InferenceServerException):
            error_infer(clients, protocol, value)
    assert error_infer(clients, protocol, 42).as_numpy("OUTPUT0").tolist() == [42]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_output_datatype_passes_as_returned(clients, protocol):
    """As Triton 2.51: a Python model's output goes with the datatype it has, not the declared one."""
    data = np.array([1.5, 2.5], dtype=np.float32)
    inputs = [make_input(protocol, "INPUT0", data, "FP32")]
    result = infer(clients, protocol, "wrong_output", inputs)
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    assert result.as_numpy("OUTPUT0").tolist() == [1, 2]


# ---------------------------------------------------------------------------- control plane in none mode


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_unload_refused_outside_explicit_mode(clients, protocol):
    kw = {"client_timeout": 10} if protocol == "grpc" else {}
    expect_error(protocol, 503, lambda: clients[protocol].load_model("sleep", **kw),
                 "explicit model load / unload is not allowed if polling is enabled")
    expect_error(protocol, 503, lambda: clients[protocol].unload_model("sleep", **kw),
                 "explicit model load / unload is not allowed if polling is enabled")
    assert clients[protocol].is_model_ready("sleep", **kw)


def test_error_body_is_json(server):
    status, body = server.post("/v2/models/no_such_model/infer", b'{"inputs":[]}',
                               headers={"Content-Type": "application/json"})
    assert status == 404
    assert json.loads(body) == {"error": "Request for unknown model: 'no_such_model' is not found"}
