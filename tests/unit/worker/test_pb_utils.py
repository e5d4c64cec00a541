from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
from inferd.worker.compat import load_pb_utils

pb = load_pb_utils()


def test_single_module_object():
    import triton_python_backend_utils as again

    assert again is pb and sys.modules["triton_python_backend_utils"] is pb


def test_tensor_basics():
    t = pb.Tensor("X", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.name() == "X" and t.shape() == [2, 3] and t.triton_dtype() == 11 and t.is_cpu()
    assert t.as_numpy().dtype == np.float32
    s = pb.Tensor("S", np.array([b"a", "b"], dtype=object))
    assert s.triton_dtype() == 13
    assert pb.Tensor("U", np.array(["x"])).triton_dtype() == 13
    assert pb.Tensor("B", np.array([True])).triton_dtype() == 1
    with pytest.raises(TypeError, match=r"incompatible constructor arguments"):  # as python_backend: ndarray only
        pb.Tensor("L", [1, 2, 3])
    with pytest.raises(pb.TritonModelException):
        pb.Tensor("C", np.zeros(2, np.complex64))
    with pytest.raises(pb.TritonModelException):
        s.to_dlpack()


def test_dlpack_roundtrip():
    a = np.arange(4, dtype=np.int32)
    t = pb.Tensor("A", a)
    b = np.from_dlpack(t)
    assert np.shares_memory(a, b)
    t2 = pb.Tensor.from_dlpack("B", t.to_dlpack())
    assert t2.name() == "B" and t2.as_numpy().tolist() == [0, 1, 2, 3]
    t3 = pb.Tensor.from_dlpack("C", a)
    assert t3.as_numpy() is not None and t.__dlpack_device__() == (1, 0)


def test_bf16_tensor_and_dlpack_roundtrip():
    raw = np.array([0x3F80, 0x4000], dtype="<u2")
    t = pb.Tensor._wrap("H", raw, "BF16")
    assert t.triton_dtype() == 14
    with pytest.raises(pb.TritonModelException):
        t.as_numpy()
    capsule = t.to_dlpack()
    with pytest.raises((BufferError, RuntimeError, TypeError, ValueError)):
        np.from_dlpack(pb._DLPackCapsule(capsule))  # a real bfloat16 capsule: numpy refuses it
    capsule = t.to_dlpack()
    back = pb.Tensor.from_dlpack("OUT", capsule)  # what identity_bf16-style models do
    assert back.triton_dtype() == 14 and back.name() == "OUT"
    assert back._array.tolist() == [0x3F80, 0x4000] and np.shares_memory(back._array, raw)
    assert pb.Tensor.from_dlpack("O2", t).triton_dtype() == 14
    # plain uint16 stays UINT16
    assert pb.Tensor.from_dlpack("U", pb.Tensor("U", raw).to_dlpack()).triton_dtype() == 3


def test_bf16_from_torch_if_available():
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    t = pb.Tensor.from_dlpack("T", x)
    assert t.triton_dtype() == 14 and t._array.tolist() == [0x3F80, 0x4000]
    y = torch.utils.dlpack.from_dlpack(t.to_dlpack())
    assert y.dtype == torch.bfloat16 and y.tolist() == [1.0, 2.0]


def test_type_helpers():
    assert pb.triton_to_numpy_type(11) is np.float32 and pb.triton_to_numpy_type(13) is np.object_
    assert pb.triton_to_numpy_type(1) is np.bool_ and pb.triton_to_numpy_type(99) is None
    assert pb.numpy_to_triton_type(np.float32) == 11 and pb.numpy_to_triton_type(np.object_) == 13
    assert pb.numpy_to_triton_type(np.bytes_) == 13 and pb.numpy_to_triton_type(np.int8) == 6
    assert pb.numpy_to_triton_type(np.complex64) is None
    assert pb.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb.triton_string_to_numpy("TYPE_BOOL") is bool
    assert set(pb.TRITON_STRING_TO_NUMPY) == {
        "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16",
        "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING",
    }


def test_bytes_serialization():
    data = np.array([b"ab", "c", 7], dtype=object)
    blob = pb.serialize_byte_tensor(data)
    assert blob == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x01\x00\x00\x007"
    assert pb.deserialize_bytes_tensor(blob).tolist() == [b"ab", b"c", b"7"]
    assert pb.serialize_byte_tensor(np.array([], dtype=object)) == ()
    assert pb.serialize_byte_tensor(np.zeros(2, np.float32)) is None
    assert pb.deserialize_bytes_tensor(np.frombuffer(blob, np.uint8)).tolist() == [b"ab", b"c", b"7"]


def test_constants():
    assert pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1 and pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb.TRITONSERVER_REQUEST_RELEASE_ALL == 1 and pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    codes = [pb.TritonError.UNKNOWN, pb.TritonError.INTERNAL, pb.TritonError.NOT_FOUND,
             pb.TritonError.INVALID_ARG, pb.TritonError.UNAVAILABLE, pb.TritonError.UNSUPPORTED,
             pb.TritonError.ALREADY_EXISTS, pb.TritonError.CANCELLED]
    assert codes == list(range(8))


def test_error_and_response():
    e = pb.TritonError("nope")
    assert e.message() == "nope" and e.code() == pb.TritonError.INTERNAL
    assert pb.TritonError("x", pb.TritonError.NOT_FOUND).code() == 2
    out = pb.Tensor("Y", np.zeros(2, np.float32))
    r = pb.InferenceResponse(output_tensors=[out], parameters={"a": 1, "b": True, "c": "s"})
    assert r.output_tensors() == [out] and not r.has_error() and r.error() is None
    assert json.loads(r.parameters()) == {"a": 1, "b": True, "c": "s"}
    assert pb.get_output_tensor_by_name(r, "Y") is out and pb.get_output_tensor_by_name(r, "Z") is None
    bad = pb.InferenceResponse(error=e)
    assert bad.has_error() and bad.error() is e and bad.output_tensors() == []
    assert pb.InferenceResponse().parameters() == "{}"
    with pytest.raises(pb.TritonModelException):
        pb.InferenceResponse(parameters={"f": 1.5})
    with pytest.raises(pb.TritonModelException):
        pb.InferenceResponse(parameters={1: "x"})
    with pytest.raises(TypeError):
        pb.InferenceResponse(output_tensors=[np.zeros(1)])


def test_request_surface():
    x = pb.Tensor("X", np.zeros(1, np.float32))
    flags = []
    req = pb.InferenceRequest._from_worker("id-1", "corr", [x], ["Y"], "m", 1, 1, 500, '{"k": 1}',
                                           lambda: bool(flags))
    assert req.request_id() == "id-1" and req.correlation_id() == "corr" and req.flags() == 1
    assert req.timeout() == 500 and json.loads(req.parameters()) == {"k": 1}
    assert req.requested_output_names() == ["Y"] and req.inputs() == [x]
    assert pb.get_input_tensor_by_name(req, "X") is x and pb.get_input_tensor_by_name(req, "Q") is None
    assert not req.is_cancelled()
    flags.append(1)
    assert req.is_cancelled() and req.get_response_sender().is_cancelled()
    assert req.trace().get_context() is None
    # user-built request (BLS): constructible; exec needs a worker of a running server
    bls = pb.InferenceRequest(model_name="other", requested_output_names=["A"], inputs=[x],
                              parameters={"p": "v"})
    assert bls.model_name() == "other" and json.loads(bls.parameters()) == {"p": "v"}
    with pytest.raises(pb.TritonModelException, match="only available inside a model served by inferd"):
        bls.exec()


def test_response_sender_one_response():
    req = pb.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    sender = req.get_response_sender()
    assert req.get_response_sender() is sender
    sender.send(pb.InferenceResponse())
    with pytest.raises(pb.TritonModelException):
        sender.send(pb.InferenceResponse())
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb.TritonModelException):
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_config_helpers():
    cfg = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": [{"name": "B"}]}
    assert pb.get_input_config_by_name(cfg, "A")["data_type"] == "TYPE_FP32"
    assert pb.get_input_config_by_name(cfg, "B") is None
    assert pb.get_output_config_by_name(cfg, "B") == {"name": "B"}
    assert pb.get_output_config_by_name({}, "B") is None
    assert pb.using_decoupled_model_transaction_policy({}) is False
    assert pb.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})


def test_logger_levels():
    stream = io.StringIO()
    pb._configure(log_verbose=0, stream=stream)
    try:
        pb.Logger.log_info("hello")
        pb.Logger.log_warn("careful")
        pb.Logger.log_error("bad")
        pb.Logger.log_verbose("hidden")
        pb.Logger.log("plain", pb.Logger.WARNING)
        lines = stream.getvalue().splitlines()
        assert [line[0] for line in lines] == ["I", "W", "E", "W"]
        assert lines[0].endswith("] hello") and "test_pb_utils.py:" in lines[0]
        pb._configure(log_verbose=1, stream=stream)
        pb.Logger.log_verbose("shown")
        assert stream.getvalue().splitlines()[-1].endswith("] shown")
    finally:
        pb._configure()


def test_metrics_basics():  # more in test_custom_metrics.py
    fam = pb.MetricFamily("requests", "count", pb.MetricFamily.COUNTER)
    metric = fam.Metric(labels={"a": "b"})
    metric.increment(2)
    assert metric.value() == 2
    with pytest.raises(pb.TritonModelException):
        metric.increment(-1)
    gauge_family = pb.MetricFamily("g", "", pb.MetricFamily.GAUGE)  # metrics live as long as their family
    gauge = gauge_family.Metric()
    gauge.set(5)
    assert gauge.value() == 5


def _config(**extra):
    base = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    base.update(extra)
    return pb.ModelConfig(json.dumps(base))


def test_model_config_batching_and_policy():
    c = _config(max_batch_size=4)
    c.set_max_batch_size(8)
    assert c.as_dict()["max_batch_size"] == 8
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8, but in auto-complete-config"):
        c.set_max_batch_size(2)
    c.set_dynamic_batching()
    assert c.as_dict()["dynamic_batching"] == {}
    with pytest.raises(ValueError, match="'sequence_batching'"):
        _config(sequence_batching={}).set_dynamic_batching()
    with pytest.raises(ValueError, match="'ensemble_scheduling'"):
        _config(ensemble_scheduling={}).set_dynamic_batching()
    c.set_model_transaction_policy({"decoupled": False})
    c.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        c.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="contains property other than 'decoupled'"):
        c.set_model_transaction_policy({"x": 1})
    assert pb.ModelConfig('{"name": "bare"}').as_dict()["input"] == []


def test_model_config_inputs_outputs():
    c = _config(input=[{"name": "A", "data_type": "TYPE_INVALID", "dims": []}])
    c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    assert c.as_dict()["input"] == [{"name": "A", "data_type": "TYPE_FP32", "dims": [2], "optional": True}]
    c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # same: fine
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input 'A'"):
        c.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2]})
    with pytest.raises(ValueError, match="the model expects dims \\[3\\] but the model configuration"):
        c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="the model expects optional False"):
        c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2], "optional": False})
    with pytest.raises(ValueError, match="contains property other than 'name', 'data_type', 'dims' and 'optional'"):
        c.add_input({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "format": "x"})
    with pytest.raises(ValueError, match="is missing 'name' property"):
        c.add_input({"data_type": "TYPE_FP32", "dims": [1]})
    with pytest.raises(ValueError, match="input 'B' in auto-complete-config function for model 'm' is missing 'dims'"):
        c.add_input({"name": "B", "data_type": "TYPE_FP32"})
    c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]})
    assert c.as_dict()["output"] == [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]
    with pytest.raises(ValueError, match="contains property other than 'name', 'data_type' and 'dims'"):
        c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [-1], "optional": True})
    with pytest.raises(ValueError, match="for output 'Y', model provides TYPE_INT8"):
        c.add_output({"name": "Y", "data_type": "TYPE_INT8", "dims": [-1]})
