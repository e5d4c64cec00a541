"""The gRPC frontend driven by the unmodified tritonclient.grpc (server in a subprocess, see conftest)."""

from __future__ import annotations

import queue
import struct

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - dev extra
    ml_dtypes = None


@pytest.fixture(scope="module")
def client(grpc_url: str) -> grpcclient.InferenceServerClient:
    c = grpcclient.InferenceServerClient(grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(grpc_url: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
    channel = grpc.insecure_channel(grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


def test_health_and_readiness(client: grpcclient.InferenceServerClient, grpc_url: str) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub")
    with pytest.raises(InferenceServerException) as err:
        client.is_model_ready("nope")
    assert _status(err.value) == "StatusCode.INVALID_ARGUMENT"
    with grpc.insecure_channel(grpc_url) as channel:  # grpc.health.v1 without its generated classes
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"") == b"\x08\x01"  # status: SERVING


def test_metadata_config_statistics(client: grpcclient.InferenceServerClient) -> None:
    md = client.get_server_metadata(as_json=True)
    assert md["name"] == "triton" and "classification" in md["extensions"]
    mm = client.get_model_metadata("add_sub", as_json=True)
    assert mm["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}
    cfg = client.get_model_config("add_sub").config
    assert cfg.name == "add_sub" and cfg.max_batch_size == 8
    assert cfg.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value.endswith("env.tar.gz")
    assert cfg.instance_group[0].kind == cfg.instance_group[0].KIND_CPU
    assert client.get_model_config("repeat").config.model_transaction_policy.decoupled
    stats = client.get_inference_statistics("add_sub").model_stats
    assert stats[0].inference_count == 3 and stats[0].inference_stats.success.count == 3
    assert stats[0].response_stats["0"].success.ns == 5
    index = client.get_model_repository_index(as_json=True)
    assert {m["name"] for m in index["models"]} >= {"identity", "add_sub"}
    client.load_model("identity", config='{"max_batch_size": 0}', files={"file:1/model.py": b"x"})
    with pytest.raises(InferenceServerException) as err:
        client.load_model("other", config="{}", files={"file:1/model.py": b"x"})
    assert "config" in str(err.value) and "file:1/model.py" in str(err.value)
    client.unload_model("identity", unload_dependents=True)
    log = client.update_log_settings({"log_verbose_level": 2}, as_json=True)
    assert log["settings"]["log_verbose_level"]["uint32_param"] == 2
    trace = client.update_trace_settings(settings={"trace_rate": "5"}, as_json=True)
    assert trace["settings"]["trace_rate"]["value"] == ["5"]


DTYPES = [
    np.bool_,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_raw_infer_every_datatype(client: grpcclient.InferenceServerClient, dtype: type) -> None:
    data = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    inp = grpcclient.InferInput("INPUT0", list(data.shape), np_to_triton_dtype(data.dtype))
    inp.set_data_from_numpy(data)
    res = client.infer("identity", [inp], request_id="r1")
    out = res.as_numpy("OUTPUT0")
    assert out.dtype == data.dtype and np.array_equal(out, data)
    assert res.get_response().id == "r1" and len(res.get_response().raw_output_contents) == 1


def test_raw_infer_bytes_and_bf16(client: grpcclient.InferenceServerClient) -> None:
    strings = np.array([[b"a", b""], [b"hello", "\u00e9".encode()]], dtype=np.object_)
    inputs = [grpcclient.InferInput("INPUT0", [2, 2], "BYTES")]
    inputs[0].set_data_from_numpy(strings)
    if ml_dtypes is not None:
        bf = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
        inputs.append(grpcclient.InferInput("INPUT1", [2], "BF16"))
        inputs[1].set_data_from_numpy(bf)
    res = client.infer("identity", inputs)
    assert np.array_equal(res.as_numpy("OUTPUT0"), strings)
    if ml_dtypes is not None:
        assert np.array_equal(res.as_numpy("OUTPUT1").astype(np.float32), [1.5, -2.0])


def test_add_sub_and_parameters(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), dtype=np.float32)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 4], "FP32"),
        grpcclient.InferInput("INPUT1", [1, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    res = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert np.array_equal(res.as_numpy("OUTPUT0"), a + b) and np.array_equal(res.as_numpy("OUTPUT1"), a - b)
    res = client.infer(
        "identity",
        inputs[:1],
        sequence_id="seq-1",
        sequence_start=True,
        sequence_end=True,
        priority=3,
        timeout=1500,
        parameters={"custom": "x", "n": 7, "f": 0.5, "b": True},
    )
    p = res.get_response().parameters
    assert p["sequence_id"].string_param == "seq-1" and p["flags"].int64_param == 3
    assert p["priority"].int64_param == 3 and p["timeout"].int64_param == 1500
    op = res.get_response().outputs[0].parameters
    assert op["echo_custom"].string_param == "x" and op["echo_n"].int64_param == 7
    assert op["echo_f"].double_param == 0.5 and op["echo_b"].bool_param is True
    res = client.infer("identity", inputs[:1], sequence_id=42)
    assert res.get_response().parameters["sequence_id"].int64_param == 42


def _typed_request(datatype: str, shape: list[int], **contents: list) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name="identity")
    t = req.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(t.contents, field).extend(values)
    return req


TYPED = [
    ("BOOL", "bool_contents", [True, False, True], np.bool_),
    ("INT8", "int_contents", [-128, 0, 127], np.int8),
    ("INT16", "int_contents", [-300, 0, 300], np.int16),
    ("INT32", "int_contents", [-(2**31), 0, 2**31 - 1], np.int32),
    ("INT64", "int64_contents", [-(2**63), 0, 2**63 - 1], np.int64),
    ("UINT8", "uint_contents", [0, 1, 255], np.uint8),
    ("UINT16", "uint_contents", [0, 1, 65535], np.uint16),
    ("UINT32", "uint_contents", [0, 1, 2**32 - 1], np.uint32),
    ("UINT64", "uint64_contents", [0, 1, 2**64 - 1], np.uint64),
    ("FP32", "fp32_contents", [0.5, -1.25, 3.0], np.float32),
    ("FP64", "fp64_contents", [0.1, -1e300, 3.0], np.float64),
]


@pytest.mark.parametrize("datatype,field,values,dtype", TYPED, ids=[t[0] for t in TYPED])
def test_typed_contents(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str, field: str, values: list, dtype: type
) -> None:
    resp = stub.ModelInfer(_typed_request(datatype, [3], **{field: values}))
    assert resp.outputs[0].datatype == datatype and not resp.outputs[0].HasField("contents")
    assert np.array_equal(np.frombuffer(resp.raw_output_contents[0], dtype=dtype), np.array(values, dtype))


def test_typed_bytes_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    resp = stub.ModelInfer(_typed_request("BYTES", [2], bytes_contents=[b"ab", b""]))
    assert resp.raw_output_contents[0] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0)


def _code(stub_call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        stub_call(request)
    return err.value.code(), err.value.details()


def test_request_errors(stub: service_pb2_grpc.GRPCInferenceServiceStub, grpc_url: str) -> None:
    bad = grpc.StatusCode.INVALID_ARGUMENT
    code, msg = _code(stub.ModelInfer, service_pb2.ModelInferRequest(model_name="nope"))
    assert code == bad and "nope" in msg
    # raw bytes that do not match shape x dtype, negative and huge dims
    for shape, raw in (([3], b"\0" * 8), ([-1, 4], b"\0" * 16), ([2**40, 2**40], b"\0" * 16)):
        req = service_pb2.ModelInferRequest(model_name="identity", raw_input_contents=[raw])
        req.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
        code, msg = _code(stub.ModelInfer, req)
        assert code == bad and "INPUT0" in msg, msg
    # contents and raw mixed; count mismatch; unknown datatype; FP16 typed; missing raw; extra raw
    req = _typed_request("INT32", [1], int_contents=[1])
    req.raw_input_contents.append(b"\0" * 4)
    req.inputs.add(name="INPUT1", datatype="INT32", shape=[1])
    assert _code(stub.ModelInfer, req)[0] == bad
    assert _code(stub.ModelInfer, _typed_request("INT32", [4], int_contents=[1]))[0] == bad
    assert _code(stub.ModelInfer, _typed_request("FLOAT", [1], fp32_contents=[1]))[0] == bad
    assert _code(stub.ModelInfer, _typed_request("FP16", [1], fp32_contents=[1]))[0] == bad
    req = service_pb2.ModelInferRequest(model_name="identity")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    assert _code(stub.ModelInfer, req)[0] == bad
    req.raw_input_contents.extend([b"\0" * 4, b"\0" * 4])
    assert _code(stub.ModelInfer, req)[0] == bad
    # BYTES framing that does not hold the declared element count
    req = service_pb2.ModelInferRequest(model_name="identity", raw_input_contents=[struct.pack("<I", 9) + b"x"])
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=[1])
    assert _code(stub.ModelInfer, req)[0] == bad
    # reserved and mistyped parameters
    req = _typed_request("INT32", [1], int_contents=[1])
    req.parameters["sequence_id"].uint64_param = 5
    assert _code(stub.ModelInfer, req)[0] == bad
    req = _typed_request("INT32", [1], int_contents=[1])
    req.parameters["triton_secret"].bool_param = True
    assert _code(stub.ModelInfer, req)[0] == bad
    # undecodable bytes: INVALID_ARGUMENT, not UNKNOWN
    with grpc.insecure_channel(grpc_url) as channel:
        for method in ("ModelInfer", "ServerLive", "ModelConfig"):
            raw_call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as err:
                raw_call(b"\xff\xff\xff\xff\x0f")
            assert err.value.code() == bad
    # decoupled model over unary ModelInfer
    req = _typed_request("INT32", [1], int_contents=[1])
    req.model_name = "repeat"
    code, msg = _code(stub.ModelInfer, req)
    assert code == grpc.StatusCode.UNIMPLEMENTED and "decoupled" in msg


def _stream_collect(client: grpcclient.InferenceServerClient, sends, expected: int, headers=None) -> list:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
    try:
        for kwargs in sends:
            client.async_stream_infer(**kwargs)
        return [results.get(timeout=10) for _ in range(expected)]
    finally:
        client.stop_stream()


def _int_input(name: str, values: list[int]) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, [len(values)], "INT32")
    inp.set_data_from_numpy(np.array(values, dtype=np.int32))
    return inp


def test_stream_non_decoupled_in_order_with_errors(client: grpcclient.InferenceServerClient) -> None:
    sends = [dict(model_name="identity", inputs=[_int_input("INPUT0", [i])], request_id=str(i)) for i in range(20)]
    sends.insert(5, dict(model_name="nope", inputs=[_int_input("INPUT0", [0])], request_id="bad"))
    got = _stream_collect(client, sends, 21)
    assert got[5][0] is None and "nope" in str(got[5][1])
    ok = [r for r, e in got if e is None]
    assert [r.get_response().id for r in ok] == [str(i) for i in range(20)]
    assert all(r.get_response().parameters["triton_final_response"].bool_param for r in ok)
    assert [int(r.as_numpy("OUTPUT0")[0]) for r in ok] == list(range(20))


def test_stream_grpc_error_mode_ends_stream(client: grpcclient.InferenceServerClient) -> None:
    sends = [
        dict(model_name="identity", inputs=[_int_input("INPUT0", [1])]),
        dict(model_name="nope", inputs=[_int_input("INPUT0", [0])]),
    ]
    got = _stream_collect(client, sends, 2, headers={"triton_grpc_error": "true"})
    assert got[0][1] is None
    assert got[1][0] is None and "INVALID_ARGUMENT" in _status(got[1][1]) and "nope" in str(got[1][1])


def test_stream_decoupled(client: grpcclient.InferenceServerClient) -> None:
    # unmarked responses (final = the last one), then core-marked ones with a flag-only final
    sends = [
        dict(model_name="repeat", inputs=[_int_input("IN", [7, 8, 9])], request_id="a"),
        dict(
            model_name="repeat",
            inputs=[_int_input("IN", [1, 2])],
            request_id="b",
            parameters={"mark_final": True},
            enable_empty_final_response=True,
        ),
        dict(
            model_name="repeat",
            inputs=[_int_input("IN", [5])],
            request_id="c",
            parameters={"mark_final": True},
        ),
    ]
    got = _stream_collect(client, sends, 7)
    assert all(e is None for _, e in got), got
    by_id: dict[str, list] = {}
    for r, _ in got:
        resp = r.get_response()
        by_id.setdefault(resp.id, []).append(
            (
                list(r.as_numpy("OUT")) if resp.outputs else None,
                resp.parameters["triton_final_response"].bool_param,
            )
        )
    assert by_id["a"] == [([7], False), ([8], False), ([9], True)]
    assert by_id["b"] == [([1], False), ([2], False), (None, True)]
    assert by_id["c"] == [([5], False)]  # its flag-only final is dropped without the opt-in


def test_stream_decoupled_error(client: grpcclient.InferenceServerClient) -> None:
    sends = [dict(model_name="repeat", inputs=[_int_input("IN", [3, -1])], request_id="x")]
    got = _stream_collect(client, sends, 2)
    assert got[0][1] is None and int(got[0][0].as_numpy("OUT")[0]) == 3
    assert got[1][0] is None and "negative" in str(got[1][1])


def test_stream_undecodable_message_keeps_stream_open(grpc_url: str) -> None:
    good = _typed_request("INT32", [1], int_contents=[4])
    good.id = "after"
    with grpc.insecure_channel(grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        replies = [
            service_pb2.ModelStreamInferResponse.FromString(b)
            for b in call(iter([b"\xff\xff\xff\xff\x0f", good.SerializeToString()]))
        ]
    assert "parse" in replies[0].error_message
    assert replies[1].infer_response.id == "after" and not replies[1].error_message


def test_cancellation_reaches_the_data_plane(client: grpcclient.InferenceServerClient) -> None:
    inp = _int_input("INPUT0", [0])
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow", [inp], client_timeout=0.2)
    assert "DEADLINE_EXCEEDED" in _status(err.value)
    done: queue.Queue = queue.Queue()
    ctx = client.async_infer("slow", [inp], callback=lambda result, error: done.put(error))
    client.infer("started", [_int_input("WANT", [2])])  # cancel only once the server runs it
    ctx.cancel()
    assert "CANCELLED" in _status(done.get(timeout=10))
    # the server-side count reaches 2 only if both awaiting infers were cancelled
    res = client.infer("cancelled", [_int_input("WANT", [2])])
    assert int(res.as_numpy("COUNT")[0]) == 2
    # closing a stream cancels what it still has running
    client.start_stream(callback=lambda result, error: None)
    client.async_stream_infer("slow", [inp])
    client.infer("started", [_int_input("WANT", [3])])
    client.stop_stream(cancel_requests=True)
    res = client.infer("cancelled", [_int_input("WANT", [3])])
    assert int(res.as_numpy("COUNT")[0]) == 3


def test_system_shared_memory(client: grpcclient.InferenceServerClient) -> None:
    import tritonclient.utils.shared_memory as shm

    data = np.arange(8, dtype=np.int32)
    handle = shm.create_shared_memory_region("inferd_test_in", "/inferd_test_grpc", 64)
    try:
        shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("r", "/inferd_test_grpc", 64)
        status = client.get_system_shared_memory_status(as_json=True)
        assert status["regions"]["r"]["byte_size"] == "64"
        inp = grpcclient.InferInput("INPUT0", [8], "INT32")
        inp.set_shared_memory("r", 32)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("r", 32, offset=32)
        res = client.infer("identity", [inp], outputs=[out])
        assert res.get_response().raw_output_contents[0] == b""
        got = shm.get_contents_as_numpy(handle, np.int32, [8], offset=32)
        assert np.array_equal(got, data)
        small = grpcclient.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("r", 16, offset=32)
        with pytest.raises(InferenceServerException) as err:
            client.infer("identity", [inp], outputs=[small])
        assert "INVALID_ARGUMENT" in _status(err.value)
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
    finally:
        shm.destroy_shared_memory_region(handle)
