"""The unmodified tritonclient.http client against the HTTP frontend."""

from __future__ import annotations

import os
import uuid
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from .fake_dataplane import ALL_DTYPES

JSON_DTYPES = [d for d in ALL_DTYPES if d not in ("FP16", "BF16")]


def sample(dt: str, n: int = 6) -> np.ndarray:
    if dt == "BYTES":
        return np.array(["héllo".encode(), b"", b"x" * 40, b"abc", b"1", b"two"][:n], dtype=np.object_)
    if dt == "BOOL":
        return np.array([True, False, True, True, False, False][:n])
    if dt == "BF16":
        return np.array([1.5, -2.0, 0.25, 3.0, 0.0, 100.0][:n], dtype=ml_dtypes.bfloat16)
    np_dt = {"UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
             "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[dt]
    if dt.startswith("UINT"):
        return np.array([0, 1, 2, 7, 100, np.iinfo(np_dt).max][:n], dtype=np_dt)
    if dt.startswith("INT"):
        return np.array([0, -1, 2, -7, np.iinfo(np_dt).min, np.iinfo(np_dt).max][:n], dtype=np_dt)
    return np.array([0.0, -1.5, 2.25, 1e3, -0.125, 7.0][:n], dtype=np_dt)


def test_health_and_metadata(client: Any, served: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata()["name"] == "triton"
    meta = client.get_model_metadata("simple")
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert client.get_model_metadata("simple", "1")["name"] == "simple"
    assert client.get_model_config("simple")["max_batch_size"] == 8
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("notready")
    assert client.get_inference_statistics("simple")["model_stats"][0]["name"] == "simple"
    assert len(client.get_inference_statistics()["model_stats"]) == len(served.dp.models)
    served.dp.is_ready = False
    try:
        assert not client.is_server_ready()
    finally:
        served.dp.is_ready = True


def test_unknown_model_and_version(client: Any) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "400" and "unknown model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("simple", "7")
    assert e.value.status() == "404"
    assert not client.is_model_ready("nope")


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_infer_simple(client: Any, binary_in: bool, binary_out: bool) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary_in)
    inputs[1].set_data_from_numpy(b, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary_out)]
    res = client.infer("simple", inputs, outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    resp = res.get_response()
    assert resp["id"] == "req-7" and resp["model_version"] == "1"
    assert ("parameters" in resp["outputs"][0]) == binary_out


def test_infer_default_outputs_and_subset(client: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    res = client.infer("simple", inputs)  # no outputs: all, binary
    assert [o["name"] for o in res.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert "id" not in res.get_response()
    res = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in res.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))


@pytest.mark.parametrize("dt", ALL_DTYPES)
def test_every_datatype_binary(client: Any, dt: str) -> None:
    data = sample(dt).reshape(2, 3) if dt != "BYTES" else sample(dt)
    inp = httpclient.InferInput("INPUT0", list(data.shape), dt)
    inp.set_data_from_numpy(data, binary_data=True)
    res = client.infer("identity_" + dt, [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    out = res.as_numpy("OUTPUT0")
    assert out.shape == data.shape
    if dt == "BYTES":
        assert out.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("dt", JSON_DTYPES)
def test_every_datatype_json(client: Any, dt: str) -> None:
    data = sample(dt) if dt == "BYTES" else sample(dt).reshape(3, 2)
    if dt == "BYTES":
        data = np.array([x.decode() for x in data], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", list(data.shape), dt)
    inp.set_data_from_numpy(data, binary_data=False)
    res = client.infer("identity_" + dt, [inp],
                       outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    out = res.as_numpy("OUTPUT0")
    assert "parameters" not in res.get_output("OUTPUT0")
    if dt == "BYTES":
        assert [x.decode() if isinstance(x, bytes) else x for x in out.tolist()] == data.tolist()
    else:
        np.testing.assert_array_equal(out, data)


def test_half_floats_json_output_refused(client: Any) -> None:
    """Triton 2.51 (checked): 400 'sending FP16 data via JSON is not supported ...'."""
    for dt in ("FP16", "BF16"):
        inp = httpclient.InferInput("INPUT0", [6], dt)
        inp.set_data_from_numpy(sample(dt), binary_data=True)
        with pytest.raises(InferenceServerException) as e:
            client.infer("identity_" + dt, [inp],
                         outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
        assert e.value.status() == "400"
        assert f"sending {dt} data via JSON is not supported" in e.value.message()


def test_non_utf8_bytes_json_output_refused(client: Any) -> None:
    inp = httpclient.InferInput("INPUT0", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=np.object_), binary_data=True)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_BYTES", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert e.value.status() == "400" and "not valid UTF-8" in e.value.message()
    res = client.infer("identity_BYTES", [inp])
    assert res.as_numpy("OUTPUT0").tolist() == [b"\xff\xfe"]


def test_zero_size_binary_output(client: Any) -> None:
    inp = httpclient.InferInput("INPUT0", [0], "FP32")
    inp.set_data_from_numpy(np.zeros(0, np.float32))
    res = client.infer("identity_FP32", [inp])
    assert res.get_output("OUTPUT0")["parameters"] == {"binary_data_size": 0}
    assert res.as_numpy("OUTPUT0").shape == (0,)


def test_infer_errors(client: Any) -> None:
    inp = httpclient.InferInput("INPUT0", [2], "INT32")
    inp.set_data_from_numpy(np.zeros(2, np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_FP32", [inp])
    assert e.value.status() == "400" and "data-type" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_INT32", [inp], outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert e.value.status() == "400" and "NOPE" in e.value.message()
    d = httpclient.InferInput("IN", [1], "FP32")
    d.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("decoupled", [d])
    assert e.value.status() == "501"
    assert "decoupled transaction policy" in e.value.message()


def test_parameters_and_sequence(client: Any, served: Any) -> None:
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([5], np.int32))
    res = client.infer("params", [inp], sequence_id=42, sequence_start=True, sequence_end=True, priority=3,
                       timeout=1000, parameters={"custom": "v", "n": 2, "flag": True, "x": 0.5})
    p = res.get_response()["parameters"]
    assert p == {"custom": "v", "n": 2, "flag": True, "x": 0.5, "correlation_id": 42, "flags": 3, "priority": 3,
                 "timeout_us": 1000}
    res = client.infer("params", [inp], sequence_id="corr-a", sequence_start=True)
    assert res.get_response()["parameters"]["correlation_id"] == "corr-a"
    assert res.get_response()["parameters"]["flags"] == 1


@pytest.mark.parametrize("algo", ["gzip", "deflate"])
def test_compression_both_ways(client: Any, algo: str) -> None:
    data = np.arange(1000, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1000], "FP32")
    inp.set_data_from_numpy(data)
    res = client.infer("identity_FP32", [inp], request_compression_algorithm=algo,
                       response_compression_algorithm=algo)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), data)


def test_repository_control(client: Any, served: Any) -> None:
    index = client.get_model_repository_index()
    assert {"name": "simple", "version": "1", "state": "READY"} in index
    client.load_model("simple", config='{"max_batch_size": 4}', files={"file:1/model.py": b"print(1)\n"})
    assert served.dp.load_calls[-1] == ("simple", {"config": '{"max_batch_size": 4}',
                                                   "file:1/model.py": b"print(1)\n"})
    client.unload_model("simple", unload_dependents=True)
    assert served.dp.unload_calls[-1] == ("simple", True)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("missing")
    assert e.value.status() == "400"


def test_settings(client: Any) -> None:
    assert client.get_trace_settings()["trace_rate"] == "1000"
    assert client.get_trace_settings(model_name="simple")["trace_mode"] == "triton"
    assert client.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert client.get_log_settings()["log_verbose_level"] == 1


def test_system_shared_memory(client: Any, served: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    key_in, key_out = f"/inferd_test_in_{tag}", f"/inferd_test_out_{tag}"
    h_in = shm.create_shared_memory_region("in_" + tag, key_in, 128)
    h_out = shm.create_shared_memory_region("out_" + tag, key_out, 128)
    try:
        a = np.arange(16, dtype=np.int32)
        b = np.full(16, 3, dtype=np.int32)
        shm.set_shared_memory_region(h_in, [a, b])
        client.register_system_shared_memory("in_" + tag, key_in, 128)
        client.register_system_shared_memory("out_" + tag, key_out, 128)
        status = client.get_system_shared_memory_status()
        assert {s["name"] for s in status} >= {"in_" + tag, "out_" + tag}
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory("in_" + tag, key_in, 128)
        assert e.value.status() == "400"
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("in_" + tag, 64)
        inputs[1].set_shared_memory("in_" + tag, 64, offset=64)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out_" + tag, 64)
        outputs[1].set_shared_memory("out_" + tag, 64, offset=64)
        res = client.infer("simple", inputs, outputs=outputs)
        out = res.get_output("OUTPUT0")
        assert "data" not in out and "parameters" not in out
        got = shm.get_contents_as_numpy(h_out, np.int32, [2, 16])
        np.testing.assert_array_equal(got[0], a + b)
        np.testing.assert_array_equal(got[1], a - b)
        with pytest.raises(InferenceServerException) as e:
            client.get_cuda_shared_memory_status("nope")
        client.unregister_system_shared_memory("in_" + tag)
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
        for k in (key_in, key_out):
            if os.path.exists("/dev/shm" + k):
                os.unlink("/dev/shm" + k)
