"""What python_backend added after Triton 2.51 (r24.10) besides is_ready() (test_model_is_ready.py), as the
server's qa L0_backend_python/parameters checks it (issue 43 item 4; docs/python-backend.md lists every
addition): `InferenceResponse(..., parameters=)` reaches the client as the response's parameters (bool, int,
str) on gRPC and HTTP, decoupled responses included; other types fail the request with python_backend's words;
a BLS response carries its callee's response parameters (regular and decoupled callees); the iterator of
`await request.async_exec(decoupled=True)` has `cancel()`, as the one of `exec(decoupled=True)`
(tests/e2e/test_bls_arguments.py).

Triton 2.51 has none of these (InferenceResponse takes no parameters there), so this module is inferd_only."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.inferd_only

RESPONDER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy().flat[0].decode()
            out = pb_utils.Tensor("OUT", np.array([[text.encode()]], dtype=np.object_))
            try:
                params = json.loads(text)
                if isinstance(params, dict):  # digit keys become ints: a key type python_backend refuses
                    params = {int(k) if k.isdigit() else k: v for k, v in params.items()}
                response = pb_utils.InferenceResponse([out], parameters=params)
            except Exception as exc:
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
            responses.append(response)
        return responses
'''

STREAMER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy().flat[0].decode()
            sender = request.get_response_sender()
            for params in json.loads(text):
                out = pb_utils.Tensor("OUT", np.array([[json.dumps(params).encode()]], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse([out], parameters=params))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

BLS = '''
import asyncio
import json
import numpy as np
import triton_python_backend_utils as pb_utils


def _params(response):
    text = response.parameters()
    return json.loads(text) if text else {}


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy().flat[0].decode()
            wanted = json.loads(text)
            tensor = pb_utils.Tensor("PARAMS", np.array([[json.dumps(wanted["one"]).encode()]], dtype=np.object_))
            one = pb_utils.InferenceRequest(model_name="responder", inputs=[tensor],
                                            requested_output_names=["OUT"]).exec()
            tensor = pb_utils.Tensor("PARAMS", np.array([[json.dumps(wanted["many"]).encode()]], dtype=np.object_))
            many = [_params(r) for r in pb_utils.InferenceRequest(
                model_name="streamer", inputs=[tensor], requested_output_names=["OUT"]).exec(decoupled=True)
                if r.output_tensors()]
            # cancel() on the iterator of async_exec(decoupled=True): the stream ends early, cancelled
            tensor = pb_utils.Tensor("PARAMS", np.array([[json.dumps([{}] * 1000).encode()]], dtype=np.object_))
            stream = await pb_utils.InferenceRequest(
                model_name="slow_streamer", inputs=[tensor], requested_output_names=["OUT"]).async_exec(True)
            first = next(stream)
            stream.cancel()
            rest = list(stream)
            ended = rest[-1].error().message() if rest and rest[-1].has_error() else "no error"
            report = {"one": _params(one), "many": many, "first": not first.has_error(), "ended": ended,
                      "after_cancel": len(rest)}
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([[json.dumps(report).encode()]], dtype=np.object_))]))
        return responses
'''

SLOW_STREAMER = STREAMER.replace("            for params in json.loads(text):\n", """\
            for params in json.loads(text):
                if request.is_cancelled():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "request cancelled", pb_utils.TritonError.CANCELLED)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                import time
                time.sleep(0.01)
""").replace("            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)\n", """\
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
""")

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
{decoupled}
input [ {{ name: "PARAMS" data_type: TYPE_STRING dims: [ 1, 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1, 1 ] }} ]
'''


@pytest.fixture(scope="module")
def server(module_server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("additions") / "models"
    for name, source, decoupled in (("responder", RESPONDER, False), ("streamer", STREAMER, True),
                                    ("slow_streamer", SLOW_STREAMER, True), ("bls", BLS, False)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(
            name=name, decoupled="model_transaction_policy { decoupled: true }" if decoupled else ""))
    return module_server_factory(repo=repo, wait_ready=["responder", "streamer", "slow_streamer", "bls"])


def _input(module, params) -> list:
    tensor = module.InferInput("PARAMS", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[json.dumps(params).encode()]], dtype=np.object_))
    return [tensor]


def _grpc_params(result) -> dict:
    out = {}
    for key, value in result.get_response().parameters.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which)
    return out


@pytest.mark.parametrize("params", [{}, {"many_elements": False}, {"bool": True, "str": "Hello World!", "int": 1024},
                                    {"a": "1", "b": "2", "c": 3, "d": False, "e": 5, "f": ""},
                                    {"big": -(1 << 63), "top": (1 << 63) - 1}])
def test_response_parameters_reach_the_client(server, params):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("responder", _input(grpcclient, params))
    assert _grpc_params(result) == params
    assert result.as_numpy("OUT")[0][0].decode() == json.dumps(params)
    client = server.http_client()
    try:
        result = client.infer("responder", _input(httpclient, params))
    finally:
        client.close()
    assert result.get_response().get("parameters", {}) == params


VALUES = "Expect parameters values to have type bool/int/str, found type "


@pytest.mark.parametrize(("params", "message"), [
    ([], ", got <class 'list'>"),
    ({"1": "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
    ({"int": 2, "float": 0.5}, VALUES + "<class 'float'>"),
    ({"bool": True, "null": None}, VALUES + "<class 'NoneType'>"),
    ({"str": "", "list": ["variable"]}, VALUES + "<class 'list'>"),
])
def test_response_parameters_of_other_types_are_refused(server, params, message):
    with grpcclient.InferenceServerClient(server.grpc_url) as client, pytest.raises(InferenceServerException) as info:
        client.infer("responder", _input(grpcclient, params))
    assert "[StatusCode.INVALID_ARGUMENT] " in str(info.value) and message in str(info.value)


def test_decoupled_responses_carry_their_parameters(server):
    params = [{"bool": False, "int": 2048}, {"str": "Hello World!"}]
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer("streamer", _input(grpcclient, params))
        responses = [got.get(timeout=30) for _ in params]
        client.stop_stream()
    for expected, (result, error) in zip(params, responses):
        assert error is None
        assert _grpc_params(result) == dict(expected, triton_final_response=False)
        assert result.as_numpy("OUT")[0][0].decode() == json.dumps(expected)


def test_bls_responses_carry_the_callees_parameters_and_async_streams_cancel(server):
    wanted = {"one": {"bool": False, "int": 2048, "str": "Hello World!"},
              "many": [{}, {"bool": True, "int": 10000}, {"str": "?"}]}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("bls", _input(grpcclient, wanted))
    report = json.loads(result.as_numpy("OUT")[0][0].decode())
    assert report["one"] == wanted["one"]
    assert report["many"] == wanted["many"]
    assert report["first"] is True
    assert "cancelled" in report["ended"] and report["after_cancel"] < 999
