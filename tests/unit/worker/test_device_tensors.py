"""Device tensors in the worker without a GPU: pb_utils' rules for them, FORCE_CPU_ONLY_INPUT_TENSORS,
and the runtime's device paths driven by a fake CUDA runtime whose "device memory" is host memory
(so pointers, handles and copies are real, only the CUDA library is stood in for)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from inferd.worker import device, tensors
from inferd.worker.backends.python_model import force_cpu_only_inputs
from inferd.worker.compat import load_pb_utils
from inferd.worker.wire import cuda_ipc
from inferd.worker.wire.errors import ErrorCode, InferdError
from inferd.worker.wire.messages import TensorRef

pb = load_pb_utils()


class FakeDeviceArray:
    """Looks like a cupy array on GPU 1 (only the interface; its memory is a host numpy array)."""

    def __init__(self, array: np.ndarray, strides=None, typestr=None) -> None:
        self.host = array
        self.device = type("Dev", (), {"id": 1})()
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": typestr or array.dtype.str, "data": (array.ctypes.data, False),
            "strides": strides, "version": 2}


# ---- FORCE_CPU_ONLY_INPUT_TENSORS ----

@pytest.mark.parametrize("params, expected", [
    ({}, True), ({"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "yes"}}, True),
    ({"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "YES"}}, True),
    ({"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}}, False),
    ({"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": " No "}}, False),
    ({"OTHER": {"string_value": "no"}}, True),
])
def test_force_cpu_only_parameter(params, expected) -> None:
    assert force_cpu_only_inputs({"parameters": params}) is expected


def test_force_cpu_only_parameter_refuses_other_values() -> None:
    with pytest.raises(InferdError) as err:
        force_cpu_only_inputs({"parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "maybe"}}})
    assert err.value.code == ErrorCode.INVALID_ARG and "FORCE_CPU_ONLY_INPUT_TENSORS" in err.value.message


def _python_model(tmp_path: Path, value: str | None):
    from inferd.worker.backends import create
    from inferd.worker.backends.base import ModelSpec, WorkerContext

    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(textwrap.dedent("""
        class TritonPythonModel:
            def execute(self, requests):
                return []
        """))
    config = {"name": "m", "input": [], "output": []}
    if value is not None:
        config["parameters"] = {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": value}}
    backend = create("python")
    backend.load(ModelSpec("m", str(tmp_path / "m"), "1", json.dumps(config), "python", "m_0", "GPU", 0),
                 WorkerContext())
    return backend


def test_python_backend_takes_device_inputs_only_when_asked(tmp_path: Path) -> None:
    assert _python_model(tmp_path / "a", None).device_inputs is False
    assert _python_model(tmp_path / "b", "no").device_inputs is True
    with pytest.raises(InferdError, match="FORCE_CPU_ONLY_INPUT_TENSORS"):
        _python_model(tmp_path / "c", "sometimes")


# ---- pb_utils.Tensor with device memory ----

def test_from_dlpack_keeps_a_cuda_array_on_its_device() -> None:
    fake = FakeDeviceArray(np.arange(6, dtype=np.float32).reshape(2, 3))
    t = pb.Tensor.from_dlpack("X", fake)
    assert not t.is_cpu() and t.memory_type() == pb.TRITONSERVER_MEMORY_GPU
    assert t.__dlpack_device__() == (2, 1) and t.shape() == [2, 3] and t.name() == "X"
    assert t.triton_dtype() == 11  # TYPE_FP32
    assert t._array.ptr == fake.host.ctypes.data  # the same memory: nothing was copied
    with pytest.raises(pb.TritonModelException, match="stored in GPU"):
        t.as_numpy()


def test_from_dlpack_refuses_non_contiguous_and_unsupported() -> None:
    base = np.zeros((4, 4), np.float32)
    with pytest.raises(pb.TritonModelException, match="C-contiguous"):
        pb.Tensor.from_dlpack("X", FakeDeviceArray(base[:, :2], strides=(16, 4)))
    with pytest.raises(pb.TritonModelException, match="unsupported dtype"):
        pb.Tensor.from_dlpack("X", FakeDeviceArray(np.zeros(2, np.complex64)))

    class OtherDevice:  # e.g. a ROCm or Metal tensor
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

        def __dlpack_device__(self):
            return (10, 0)

    with pytest.raises(pb.TritonModelException, match="not supported"):
        pb.Tensor.from_dlpack("X", OtherDevice())


def test_tensor_constructor_refuses_device_memory() -> None:
    with pytest.raises(TypeError, match="from_dlpack"):  # python_backend: a TypeError (ndarray only)
        pb.Tensor("X", FakeDeviceArray(np.zeros(2, np.float32)))


def test_host_tensors_are_unchanged() -> None:
    t = pb.Tensor("X", np.ones(3, np.float32))
    assert t.is_cpu() and t.memory_type() == pb.TRITONSERVER_MEMORY_CPU and t.__dlpack_device__() == (1, 0)


def test_device_array_reshape_and_output_check() -> None:
    fake = FakeDeviceArray(np.zeros((2, 6), np.float32))
    array = device.from_object(fake, "Y")
    spec = tensors.OutputSpec("Y", "FP32", "TYPE_FP32", [2, 6], None)
    assert tensors.check_output(spec, "Y", "FP32", array, "m") is array
    spec = tensors.OutputSpec("Y", "FP32", "TYPE_FP32", [-1, 3, 2], [-1, 6])
    reshaped = tensors.check_output(spec, "Y", "FP32", array, "m")
    assert reshaped.shape == (2, 3, 2) and reshaped.ptr == array.ptr
    with pytest.raises(ValueError):
        array.reshape((5,))


# ---- the runtime's device paths with a fake CUDA runtime (device memory = host memory) ----

class HostBackedCuda(cuda_ipc._Runtime):
    """Allocations are numpy buffers registered here; a handle names one allocation."""

    name = "host-backed fake"

    def __init__(self) -> None:
        self.allocs: dict[int, int] = {}  # base -> size
        self.opens = 0

    def add(self, array: np.ndarray) -> None:
        self.allocs[array.ctypes.data] = array.nbytes

    def device_count(self) -> int:
        return 1

    def set_device(self, device: int) -> None:
        pass

    def init_context(self) -> None:
        pass

    def address_range(self, ptr: int) -> tuple[int, int]:
        for base, size in self.allocs.items():
            if base <= ptr < base + size:
                return base, size
        raise cuda_ipc.CudaIpcError("not an allocation")

    def get_handle(self, ptr: int) -> bytes:
        return ptr.to_bytes(8, "little") + bytes(56)

    def open(self, handle: bytes) -> int:
        self.opens += 1
        return int.from_bytes(handle[:8], "little")

    def close(self, ptr: int) -> None:
        pass

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def synchronize(self) -> None:
        pass


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> HostBackedCuda:
    rt = HostBackedCuda()
    monkeypatch.setattr(cuda_ipc, "_runtime", rt)
    monkeypatch.setattr(cuda_ipc, "_opened", {})
    monkeypatch.setattr(cuda_ipc, "_initialised", threading.local())
    return rt


def test_export_then_open_round_trip(fake_cuda: HostBackedCuda) -> None:
    memory = np.arange(64, dtype=np.float32)
    fake_cuda.add(memory)
    producer = device.from_object(FakeDeviceArray(memory[16:32]), "Y")
    region, offset = device.export(producer)
    assert offset == 64
    ref = TensorRef("Y", "FP32", [16], loc="cuda", region=region, offset=offset, nbytes=64, owner="p_0")
    mine = device.open_ref(ref)  # our own export coming back: used in place (a process cannot open its own handle)
    assert mine.ptr == producer.ptr and fake_cuda.opens == 0
    device._exported.clear()  # as seen from another process
    consumer = device.open_ref(ref)
    again = device.open_ref(ref)
    assert consumer.ptr == again.ptr == memory[16:].ctypes.data and fake_cuda.opens == 1  # cached
    np.testing.assert_array_equal(consumer.to_numpy(), memory[16:32])


def test_device_input_arrives_on_cpu_unless_the_backend_takes_device_inputs(fake_cuda: HostBackedCuda) -> None:
    memory = np.arange(8, dtype=np.int32)
    fake_cuda.add(memory)
    region, offset = device.export(device.from_object(FakeDeviceArray(memory), "X"))
    ref = TensorRef("X", "INT32", [2, 4], loc="cuda", region=region, offset=offset, nbytes=32, owner="p_0")
    cache = tensors.ShmCache()
    host = tensors.input_array(ref, [], cache)
    assert type(host) is np.ndarray and host.shape == (2, 4)
    np.testing.assert_array_equal(host.reshape(-1), memory)
    cache.device_inputs = True
    on_device = tensors.input_array(ref, [], cache)
    assert type(on_device) is device.DeviceArray and on_device.ptr == memory.ctypes.data


def test_malformed_device_input_is_an_error_naming_it(fake_cuda: HostBackedCuda) -> None:
    bad = TensorRef("X", "INT32", [2], loc="cuda", region="00" * 64, offset=0, nbytes=99, owner="p_0")
    with pytest.raises(InferdError, match="device input 'X' \\(from instance 'p_0'\\)"):
        tensors.input_array(bad, [], tensors.ShmCache())


def test_worker_writes_device_outputs_by_handle_or_host_copy(fake_cuda: HostBackedCuda) -> None:
    from inferd.worker.backends.base import ModelSpec, Request, Response, Tensor
    from inferd.worker.result_writer import ResultWriter
    from inferd.worker.wire.messages import FramePacker

    memory = np.arange(16, dtype=np.float32)
    fake_cuda.add(memory)
    writer = ResultWriter(lambda message: None)
    writer.configure(ModelSpec("m", "", "1", json.dumps({"output": [
        {"name": "Y", "data_type": "TYPE_FP32", "dims": [16]}]}), "python", "gpu_model_0"),
        checks_outputs=False)  # a Python model: outputs go as returned
    result = Response([Tensor("Y", "FP32", device.from_object(FakeDeviceArray(memory), "Y"))])

    to_worker = Request(1, "", [], [])
    to_worker.device_outputs = True
    item = json.loads(writer.item(to_worker, result, FramePacker()))
    ref = item["outputs"][0]
    assert (ref["loc"], ref["owner"], ref["nbytes"], ref["offset"]) == ("cuda", "gpu_model_0", 64, 0)
    key = device.ref_key(ref["region"], ref["offset"])
    assert len(writer._device_exports[key]) == 1  # held until the supervisor releases it
    writer.release([], [key])
    assert writer._device_exports == {}

    to_client = Request(2, "", [], [])  # the frontend edge: the worker copies it to the host
    packer = FramePacker()
    item = json.loads(writer.item(to_client, result, packer))
    ref = item["outputs"][0]
    assert ref.get("loc", "frame") == "frame"
    frames = packer.finish()
    np.testing.assert_array_equal(np.frombuffer(memoryview(frames[ref["frame"]]), np.float32), memory)
    writer.close()


def test_cpu_worker_never_imports_a_cuda_library(tmp_path: Path) -> None:
    """A Python model on the CPU, run through the worker's backend and runtime modules: no torch,
    cupy or cuda-python module is loaded (they are not needed in a CPU model environment)."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(textwrap.dedent("""
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "X")
                    t = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())
                    out.append(pb_utils.InferenceResponse([t]))
                return out
        """))
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        from inferd.worker import message_loop as runtime
        from inferd.worker.backends import create
        from inferd.worker.backends.base import ModelSpec, Request, Tensor, WorkerContext
        cfg = {"name": "m", "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
               "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]}
        b = create("python")
        b.load(ModelSpec("m", sys.argv[1], "1", json.dumps(cfg), "python", "m_0", "CPU", 0), WorkerContext())
        r = b.execute([Request(1, "", [Tensor("X", "FP32", np.ones(2, np.float32))], [])])
        assert r[0].error is None, r[0].error
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "cupy", "cuda", "nvidia"))
        print("loaded:", bad)
        """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "loaded: []"


def test_onnxruntime_io_binding_path_with_host_backed_device_memory(tmp_path: Path, fake_cuda: HostBackedCuda) -> None:
    """The GPU instance's I/O-binding run, bound to CPU memory here (the same calls with device "cuda" on a
    GPU): a device input is bound by pointer, a host input from numpy, outputs come back as DeviceArrays
    over the OrtValues, one run per request when device inputs cannot be concatenated."""
    pytest.importorskip("onnx")
    from inferd.worker.backends import create
    from inferd.worker.backends.base import ModelSpec, Request, Tensor, WorkerContext

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from framework_models import onnx_add_sub

    onnx_add_sub(tmp_path, "add_sub", dims=(4,), batch=True, config=False)
    config = {"name": "add_sub", "max_batch_size": 8,
              "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")],
              "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")]}
    backend = create("onnxruntime")
    backend.load(ModelSpec("add_sub", str(tmp_path / "add_sub"), "1", json.dumps(config), "onnxruntime",
                           "add_sub_0", "CPU", 0), WorkerContext())
    backend._gpu, backend._bind_device = True, "cpu"  # what load() sets on a GPU instance, bound to host memory
    memory = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
    fake_cuda.add(memory)
    requests = []
    for i in range(2):
        x = device.from_object(FakeDeviceArray(memory[i]), "INPUT0")
        requests.append(Request(i, "", [Tensor("INPUT0", "FP32", x),
                                        Tensor("INPUT1", "FP32", np.ones((2, 4), np.float32))], []))
    responses = backend.execute(requests)
    for i, response in enumerate(responses):
        assert response.error is None, response.error
        out = {t.name: t.array for t in response.outputs}
        assert type(out["OUTPUT0"]) is device.DeviceArray and out["OUTPUT0"].shape == (2, 4)
        np.testing.assert_array_equal(out["OUTPUT0"].to_numpy(), memory[i] + 1)
        np.testing.assert_array_equal(out["OUTPUT1"].to_numpy(), memory[i] - 1)


def test_device_array_row_slices_split_a_batch(fake_cuda: HostBackedCuda) -> None:
    memory = np.arange(12, dtype=np.int64).reshape(3, 4)
    fake_cuda.add(memory)
    array = device.from_object(FakeDeviceArray(memory), "Y")
    part = array[1:3]
    assert part.shape == (2, 4) and part.nbytes == 64 and part.ptr == memory[1].ctypes.data
    np.testing.assert_array_equal(part.to_numpy(), memory[1:3])
    with pytest.raises(TypeError):
        array[::2]
