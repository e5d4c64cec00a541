from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import zmq
from inferd.worker import tensors
from inferd.worker.backends.base import Tensor
from inferd.worker.wire import bytes_codec, shm
from inferd.worker.wire.errors import ErrorCode, InferdError
from inferd.worker.wire.messages import TensorRef


def ref(name, datatype, shape, frame=0, **kw):
    return TensorRef(name=name, datatype=datatype, shape=shape, frame=frame, **kw)


@pytest.fixture
def cache():
    c = tensors.ShmCache(max_regions=2)
    yield c
    c.close()


@pytest.mark.parametrize(
    "datatype,dtype",
    [("FP32", "<f4"), ("INT64", "<i8"), ("UINT8", "u1"), ("FP16", "<f2"), ("BOOL", "?"), ("FP64", "<f8")],
)
def test_frame_inputs_are_zero_copy_writable_views(datatype, dtype, cache):
    data = np.arange(6).astype(dtype).reshape(2, 3)
    frame = zmq.Frame(data.tobytes())
    arr = tensors.input_array(ref("X", datatype, [2, 3]), [frame], cache)
    np.testing.assert_array_equal(arr, data)
    assert arr.dtype == np.dtype(dtype) and arr.flags.writeable
    assert np.shares_memory(arr, np.frombuffer(frame.buffer, dtype=np.uint8))


def test_bytes_input_is_object_array_of_bytes(cache):
    buf = bytes_codec.serialize(np.array([b"a", b"", "é"], dtype=object))
    arr = tensors.input_array(ref("S", "BYTES", [3, 1]), [buf], cache)
    assert arr.dtype == object and arr.shape == (3, 1)
    assert arr.reshape(-1).tolist() == [b"a", b"", "é".encode()]
    with pytest.raises(InferdError) as err:
        tensors.input_array(ref("S", "BYTES", [4]), [buf], cache)
    assert err.value.code == ErrorCode.INVALID_ARG


def test_bf16_input_stays_raw_uint16(cache):
    raw = np.array([0x3F80, 0x4000], dtype="<u2")  # 1.0, 2.0 in bfloat16
    arr = tensors.input_array(ref("B", "BF16", [2]), [raw.tobytes()], cache)
    assert arr.dtype == np.dtype("<u2") and arr.tolist() == [0x3F80, 0x4000]


@pytest.mark.parametrize(
    "bad",
    [
        ref("X", "FP32", [3]),  # 8 bytes for 3 floats
        ref("X", "FP99", [2]),
        ref("X", "FP32", [-2]),
        ref("X", "FP32", [2], frame=5),
        ref("X", "FP32", [2], loc="tape"),
    ],
)
def test_bad_input_refs(bad, cache):
    with pytest.raises(InferdError):
        tensors.input_array(bad, [np.zeros(2, np.float32).tobytes()], cache)


@pytest.mark.parametrize(
    "given",
    [
        ref("X", "FP32", [2]),  # the whole frame
        ref("X", "FP32", [2], offset=0, nbytes=8),
        ref("X", "FP32", [1], offset=4, nbytes=4),  # a slice of a shared frame
        ref("X", "FP32", [1, 1], offset=8, nbytes=4),
        ref("X", "INT16", [2], offset=2, nbytes=4),
        ref("X", "BF16", [2], offset=0, nbytes=4),
        ref("X", "FP32", [0], offset=0, nbytes=0),  # (offset 0, nbytes 0) names the whole frame: too long
        ref("X", "UINT8", [], offset=3, nbytes=1),
        ref("X", "BYTES", [1], frame=1),  # not inline: input_array's own path
        ref("X", "FP32", [3]),  # 12 bytes asked, the frame holds 16
        ref("X", "FP32", [1], offset=14, nbytes=4),  # beyond the frame
        ref("X", "FP32", [1], offset=-4, nbytes=4),
        ref("X", "FP32", [2, -1]),
        ref("X", "FP32", [2.0]),
        ref("X", "FP32", (4,)),  # a tuple shape: input_array checks it
        ref("X", "FP99", [4]),
        ref("X", "FP32", [4], frame=7),
        ref("X", "FP32", [4], frame="0"),
        ref("X", "FP32", [4], loc="tape"),
    ],
)
def test_input_tensors_equal_input_array(given, cache):
    """tensors.input_tensors (the execute loop's per-request form, with the data-frame case inline) gives
    what input_array gives, value and dtype, or the same error."""
    frames = tensors.frame_buffers([bytearray(np.arange(4, dtype="<f4").tobytes()),  # writable, as received
                                    bytearray(bytes_codec.serialize(np.array([b"ab"], dtype=object)))])
    try:
        expected = tensors.input_array(given, frames, cache)
    except Exception as exc:  # (a frame index that is not an int: a TypeError, which fails the request too)
        with pytest.raises(type(exc)) as got:
            tensors.input_tensors([given], frames, cache, Tensor)
        assert str(got.value) == str(exc) and getattr(got.value, "code", None) == getattr(exc, "code", None)
        return
    (tensor,) = tensors.input_tensors([given], frames, cache, Tensor)
    assert (tensor.name, tensor.datatype) == ("X", given.datatype)
    assert tensor.array.dtype == expected.dtype and tensor.array.shape == expected.shape
    assert tensor.array.tobytes() == expected.tobytes() if expected.dtype != object else \
        tensor.array.tolist() == expected.tolist()
    if expected.dtype != object:
        assert tensor.array.flags.writeable and np.shares_memory(tensor.array, expected)


def test_shm_inputs_cached_forgotten_and_recreated(cache):
    name = shm.make_name(os.getpid(), "tt" + uuid.uuid4().hex[:10])
    region = shm.create(name, 1024)
    try:
        handle = region.name
        region.buf[16:32] = np.arange(4, dtype="<f4").tobytes()
        r = ref("X", "FP32", [4], loc="shm", region=handle, offset=16, nbytes=16)
        a = tensors.input_array(r, [], cache)
        np.testing.assert_array_equal(a, [0, 1, 2, 3])
        assert a.flags.writeable and handle in cache
        region.buf[16:20] = np.array([9], dtype="<f4").tobytes()  # shared mapping: visible
        assert tensors.input_array(r, [], cache)[0] == 9
        with pytest.raises(InferdError):
            tensors.input_array(ref("X", "FP32", [4], loc="shm", region=handle, offset=1020, nbytes=16), [], cache)
        cache.forget([handle])
        assert handle not in cache
        # once its creator closed it, a handle reaches nothing (a region is never re-created under a handle)
        region.close()
        with pytest.raises(InferdError):
            tensors.input_array(r, [], cache)
    finally:
        region.close()
    # a plain /dev/shm name re-created with new content: the stale mapping is not used
    plain = shm.make_name(os.getpid(), "tp" + uuid.uuid4().hex[:10])
    r = ref("X", "FP32", [4], loc="shm", region=plain, offset=16, nbytes=16)
    try:
        for value in (1, 7):
            with open("/dev/shm/" + plain, "wb") as f:
                f.write(bytes(16) + np.full(4, value, dtype="<f4").tobytes())
            np.testing.assert_array_equal(tensors.input_array(r, [], cache), [value] * 4)
            shm.unlink(plain)
    finally:
        shm.unlink(plain)


def test_shm_cache_is_bounded(cache):
    regions = [shm.create(shm.make_name(os.getpid(), "tb%d%s" % (i, uuid.uuid4().hex[:8])), 64) for i in range(3)]
    try:
        for region in regions:
            tensors.input_array(ref("X", "UINT8", [4], loc="shm", region=region.name, nbytes=4), [], cache)
        assert len(cache) == 2 and regions[0].name not in cache
    finally:
        for region in regions:
            region.close()


def test_missing_region(cache):
    with pytest.raises(InferdError) as err:
        tensors.input_array(ref("X", "UINT8", [1], loc="shm", region="inferd_1_nope", nbytes=1), [], cache)
    assert err.value.code == ErrorCode.NOT_FOUND


# ---- outputs ----------------------------------------------------------------------------------


CONFIG = {
    "max_batch_size": 8,
    "output": [
        {"name": "Y", "data_type": "TYPE_FP32", "dims": [3]},
        {"name": "S", "data_type": "TYPE_STRING", "dims": [-1]},
        {"name": "R", "data_type": "TYPE_INT32", "dims": [2, 2], "reshape": {"shape": [4]}},
    ],
}


def test_output_specs_and_checks():
    specs = tensors.output_specs(CONFIG)
    assert specs["Y"].shape == [-1, 3] and specs["Y"].datatype == "FP32"
    y = np.zeros((5, 3), np.float32)
    assert tensors.check_output(specs["Y"], "Y", "FP32", y, "m") is y
    with pytest.raises(InferdError) as err:
        tensors.check_output(specs["Y"], "Y", "FP64", y.astype(np.float64), "m")
    assert err.value.code == ErrorCode.INTERNAL and "'Y'" in err.value.message and "'m'" in err.value.message
    with pytest.raises(InferdError):
        tensors.check_output(specs["Y"], "Y", "FP32", np.zeros((5, 4), np.float32), "m")
    with pytest.raises(InferdError):
        tensors.check_output(specs["Y"], "Y", "FP32", np.zeros(3, np.float32), "m")
    with pytest.raises(InferdError) as err:
        tensors.check_output(None, "Z", "FP32", y, "m")
    assert "not declared" in err.value.message
    # reshape: the model produces [batch, 4], the client sees [batch, 2, 2]
    out = tensors.check_output(specs["R"], "R", "INT32", np.zeros((3, 4), np.int32), "m")
    assert out.shape == (3, 2, 2)


def test_python_outputs_pass_as_returned():
    """As Triton's Python backend: another datatype or shape than the configuration's passes unchanged."""
    specs = tensors.output_specs(CONFIG)
    y = np.zeros((5, 3), np.float32)
    for other in (y, y.astype(np.float64), np.zeros((5, 4), np.float32), np.zeros(3, np.float32)):
        assert tensors.output_as_returned(specs["Y"], "Y", "FP32", other, "m") is other
    assert tensors.output_as_returned(None, "Z", "FP32", y, "m") is y
    out = tensors.output_as_returned(specs["R"], "R", "INT32", np.zeros((3, 4), np.int32), "m")
    assert out.shape == (3, 2, 2)  # the configuration's reshape still applies
    assert tensors.output_as_returned(specs["R"], "R", "INT64", np.zeros((3, 4), np.int64), "m").shape == (3, 2, 2)
    for same in (np.zeros((3, 2, 2), np.int32), np.zeros((3, 5), np.int32)):  # dims already, or neither
        assert tensors.output_as_returned(specs["R"], "R", "INT32", same, "m") is same


def test_output_data():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous
    shape, data, nbytes = tensors.output_data("FP32", a)
    assert list(shape) == [3, 2] and nbytes == 24
    np.testing.assert_array_equal(np.frombuffer(data, "<f4").reshape(3, 2), a)

    big = np.arange(4, dtype=">i4")
    _, data, _ = tensors.output_data("INT32", big)
    assert np.frombuffer(data, "<i4").tolist() == [0, 1, 2, 3]

    c = np.ascontiguousarray(np.arange(4, dtype=np.int64))
    _, data, _ = tensors.output_data("INT64", c)
    assert np.shares_memory(data, c)  # zero copy

    large = np.arange(1 << 16, dtype=np.int64)  # above the zero-copy size: a flat byte view, still no copy
    _, data, nbytes = tensors.output_data("INT64", large)
    assert data.dtype == np.uint8 and data.ndim == 1 and nbytes == large.nbytes and np.shares_memory(data, large)

    scalar = np.array(5, dtype=np.int32)
    shape, data, _ = tensors.output_data("INT32", scalar)
    assert list(shape) == [] and memoryview(data).tobytes() == b"\x05\x00\x00\x00"

    s = np.array([["x", b"yz"]], dtype=object)
    shape, data, _ = tensors.output_data("BYTES", s)
    assert list(shape) == [1, 2] and bytes_codec.deserialize(data).tolist() == [b"x", b"yz"]

    empty = np.zeros((0, 3), np.float32)
    shape, data, nbytes = tensors.output_data("FP32", empty)
    assert list(shape) == [0, 3] and nbytes == 0
