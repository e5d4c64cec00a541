"""Python-backend semantics as Triton 2.51's (issue 28): async decoupled executions run concurrently,
response senders of non-decoupled models, pb_utils' argument checks, BLS only inside execute.
Unmodified tritonclient; passes against the real Triton too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import json
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import wait_for
from tritonclient.utils import InferenceServerException

MODELS = ["async_decoupled", "async_decoupled_bls", "identity_fp32", "sender_nondecoupled", "pb_arg_checks",
          "bls_in_init"]


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS, wait_ready=[m for m in MODELS if m != "bls_in_init"])


def _input(mod, name, array, datatype):
    tensor = mod.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _stream(server, count, seconds, parameters=None, model="async_decoupled"):
    """`count` requests on one gRPC stream; (seconds until each answer, outputs)."""
    client = server.grpc_client()
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), result, error)))
    try:
        start = time.monotonic()
        for i in range(count):
            client.async_stream_infer(
                model, [_input(grpcclient, "IN", np.array([seconds], np.float32), "FP32")],
                request_id=str(i), parameters=parameters)
        got = [answers.get(timeout=60) for _ in range(count)]
    finally:
        client.stop_stream()
        client.close()
    for _, _result, error in got:
        assert error is None, error
    return [at - start for at, _, _ in got], [result.as_numpy("OUT") for _, result, _ in got]


def test_async_decoupled_executions_run_concurrently(server):
    """4 requests that each sleep 1 s on the model's loop all finish at about 1 s (not 1, 2, 3, 4 s)."""
    times, outs = _stream(server, 4, 1.0)
    assert all(float(out[0]) == 1.0 for out in outs)
    assert max(times) < 2.5, times


def test_async_bls_inside_concurrent_executions(server):
    """await async_exec() and an iterated exec(decoupled=True) inside concurrent async executions."""
    times, outs = _stream(server, 3, 2.0, parameters={"bls": 1})
    assert [float(out[0]) for out in outs] == [4.0, 4.0, 4.0]
    assert max(times) < 1.4, times  # each sleeps 0.5 s after its BLS calls; in turn it would be >= 1.5 s


def test_async_exec_decoupled_iterated_with_a_plain_for(server):
    """Triton's qa async_execute test_concurrent_execute_multi_request_bls: 4 requests, each awaiting
    async_exec(decoupled=True) on a model that sleeps 1 s and walking the iterator with a plain `for`,
    overlap (the first response is awaited off the loop): about 1 s, not 4 s."""
    times, outs = _stream(server, 4, 1.0, model="async_decoupled_bls")
    assert all(float(out[0]) == 1.0 for out in outs)
    assert max(times) < 2.5, times


def _sender_infer(client, mod, mode):
    return client.infer("sender_nondecoupled", [_input(mod, "IN", np.zeros(1, np.int32), "INT32")],
                        parameters={"mode": mode})


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode,value", [("sender", 1), ("later", 2), ("send_and_return", 5), ("", 0)])
def test_non_decoupled_response_sender(server, protocol, mode, value):
    """Sent (also after execute returned None) or sent and returned: the client gets the sent response."""
    mod = httpclient if protocol == "http" else grpcclient
    client = server.http_client() if protocol == "http" else server.grpc_client()
    result = _sender_infer(client, mod, mode)
    assert result.as_numpy("OUT").tolist() == [value]
    client.close()


def test_non_decoupled_sending_twice_on_a_stream(server):
    """Triton's qa response_sender test_non_decoupled_two_response_pre_return: over a gRPC stream the first
    response arrives without an error, what came after it is dropped (checked against Triton 2.51)."""
    client = server.grpc_client()
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("sender_nondecoupled", [_input(grpcclient, "IN", np.zeros(1, np.int32), "INT32")],
                                  parameters={"mode": "twice"}, request_id="a")
        client.async_stream_infer("sender_nondecoupled", [_input(grpcclient, "IN", np.zeros(1, np.int32), "INT32")],
                                  parameters={"mode": "sender"}, request_id="b")
        got = [answers.get(timeout=60) for _ in range(2)]
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in got] == [None, None], got
    assert sorted((r.get_response().id, r.as_numpy("OUT").tolist()) for r, _ in got) == [("a", [3]), ("b", [1])]
    assert answers.empty()


def test_non_decoupled_sending_twice(server):
    """A second response: the model's send raises (logged with Triton's message) and the client sees
    Triton's error for a non-decoupled request given two responses."""
    client = server.grpc_client()
    with pytest.raises(InferenceServerException) as info:
        _sender_infer(client, grpcclient, "twice")
    assert "expected a single response, got 2" in str(info.value)
    client.close()
    wait_for(lambda: "Non-decoupled model cannot send more than one response" in server.log(), 30,
             "the misuse in the server log")


def test_pb_utils_argument_checks(server):
    client = server.http_client()
    result = client.infer("pb_arg_checks", [_input(httpclient, "IN", np.zeros(1, np.int32), "INT32")])
    seen = json.loads(result.as_numpy("OUT")[0])
    # as python_backend 2.51 raises them (Triton's qa/L0_backend_python argument_validation), checked
    # against Triton with INFERD_E2E_TARGET=triton
    assert seen == {
        "tensor_name_none": "TypeError", "tensor_array_none": "TypeError", "tensor_empty_name_array_none": "TypeError",
        "tensor_empty_name": "TritonModelException", "dlpack_none": "TritonModelException",
        "dlpack_empty_name": "TritonModelException",
        "logger_level_none": "TypeError", "logger_level_int": "TypeError", "logger_level_enum": "none",
        "logger_default_level": "none", "log_info_none": "TypeError", "log_warn_none": "TypeError",
        "log_error_none": "TypeError", "log_verbose_none": "TypeError",
        "request_input_none": "TritonModelException", "request_inputs_none": "TypeError",
        "request_model_name_none": "TypeError", "request_output_names_none": "TypeError",
        "request_output_name_none": "TypeError", "request_correlation_id_none": "TypeError",
        "request_id_none": "TypeError", "request_model_version_none": "TypeError", "request_flags_none": "TypeError",
        "request_empty_lists": "none", "request_correlation_ids": "none", "request_without_inputs": "TypeError",
        "request_without_model_name": "TypeError", "request_without_output_names": "TypeError",
        "response_output_none": "TritonModelException", "response_outputs_none": "TypeError",
        "response_empty": "none", "response_positional": "none",
    }
    client.close()


def test_bls_in_initialize_fails_the_load(server):
    client = server.http_client()
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["bls_in_init"]["state"] == "UNAVAILABLE"
    assert "BLS is only supported during the 'execute' function." in index["bls_in_init"]["reason"]
    client.close()


@pytest.fixture(scope="module")
def reschedule_server(module_server_factory):
    return module_server_factory(["reschedule", "reschedule_decoupled"])


def _int_input(mod, value):
    return _input(mod, "IN", np.array([value], np.int32), "INT32")


def test_rescheduled_request_runs_again(reschedule_server):
    """iterative_sequence: accepted without a correlation id; the model reschedules it twice and
    answers on its third run."""
    client = reschedule_server.http_client()
    result = client.infer("reschedule", [_int_input(httpclient, 3)], request_id="a")
    assert result.as_numpy("OUT").tolist() == [3]
    client.close()


def test_rescheduled_request_returning_a_response(reschedule_server):
    client = reschedule_server.http_client()
    with pytest.raises(InferenceServerException) as info:
        client.infer("reschedule", [_int_input(httpclient, 3)], request_id="b", parameters={"wrong": 1})
    assert ("Failed to process the request(s) for model 'reschedule_0_0', message: Expected a None object in the "
            "execute function return list for reschduled request, found type '") in str(info.value)
    client.close()


def test_decoupled_iterative_generation(reschedule_server):
    client = reschedule_server.grpc_client()
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("reschedule_decoupled", [_int_input(grpcclient, 3)], request_id="c",
                                  enable_empty_final_response=True)
        got = []
        while True:
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            got.append(result.as_numpy("OUT").tolist())
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert got == [[1], [2], [3]]


def test_bls_in_finalize_is_refused(server_factory):
    server = server_factory(["bls_in_finalize", "identity_fp32"], control_mode="explicit",
                            load_models=["bls_in_finalize", "identity_fp32"])
    client = server.http_client()
    client.unload_model("bls_in_finalize")
    wanted = "finalize-bls: TritonModelException: BLS is only supported during the 'execute' function."
    wait_for(lambda: wanted in server.log(), 30, "finalize's log line")
    client.close()
