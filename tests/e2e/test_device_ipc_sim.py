"""The device-tensor data path end to end on a CPU: real server, real workers, real wire and
bookkeeping, with only the CUDA runtime stood in for (tests/fake_cuda.py: "device memory" is a shared
memory file, its IPC handle the file's name). What tests/gpu/test_gpu_ipc.py checks on a GPU, minus
the GPU: BLS hand-over of a device tensor both ways, an ensemble step's device output opened by the next
step (FORCE_CPU_ONLY_INPUT_TENSORS "no") or copied to the CPU for it ("yes"), every allocation released
to its producer once its consumers are done, and kill -9 of a producer failing the request that still
holds its memory, naming it."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import time
from pathlib import Path

import fake_cuda
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

pytestmark = pytest.mark.inferd_only

HEADER = '''
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils
import fake_cuda
'''

PRODUCER = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        self.rt = fake_cuda.install()

    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            y = pb_utils.Tensor.from_dlpack("Y", fake_cuda.FakeGpuArray(self.rt, np.full(n, 1.5, np.float32)))
            assert not y.is_cpu()
            out.append(pb_utils.InferenceResponse([y]))
        return out
'''

# input Y: on the "GPU" when FORCE_CPU_ONLY_INPUT_TENSORS is "no", else a numpy array; Z = Y + 1 as a
# device tensor; ONDEV reports where Y arrived
PLUS_ONE = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        self.rt = fake_cuda.install()

    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y")
            host = y.as_numpy() if y.is_cpu() else fake_cuda.to_host(y)
            z = pb_utils.Tensor.from_dlpack("Z", fake_cuda.FakeGpuArray(self.rt, host + 1))
            ondev = pb_utils.Tensor("ONDEV", np.array([0 if y.is_cpu() else 1], np.int32))
            out.append(pb_utils.InferenceResponse([z, ondev]))
        return out
'''

# BLS: gets a device tensor from `producer`, passes it on to `checker` (a tensor it was given) and a
# device tensor of its own; reports [output on device, values right, checker verdict on both]
CONSUMER = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        self.rt = fake_cuda.install()

    def check(self, tensor):
        reply = pb_utils.InferenceRequest(model_name="checker", requested_output_names=["OK"],
                                          inputs=[tensor]).exec()
        if reply.has_error():
            raise RuntimeError(reply.error().message())
        return int(pb_utils.get_output_tensor_by_name(reply, "OK").as_numpy()[0])

    def execute(self, requests):
        out = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            reply = pb_utils.InferenceRequest(model_name="producer", requested_output_names=["Y"],
                                              inputs=[n]).exec()
            if reply.has_error():
                raise RuntimeError(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "Y")
            right = bool((fake_cuda.to_host(y) == 1.5).all())
            given = self.check(pb_utils.Tensor.from_dlpack("Y", y))
            count = int(n.as_numpy()[0])
            mine = fake_cuda.FakeGpuArray(self.rt, np.full(count, 1.5, np.float32))
            own = self.check(pb_utils.Tensor.from_dlpack("Y", mine))
            report = np.array([int(not y.is_cpu()), int(right), given, own], np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", report)]))
        return out
'''

CHECKER = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        fake_cuda.install()

    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y")
            ok = (not y.is_cpu()) and bool((fake_cuda.to_host(y) == 1.5).all())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([int(ok)], np.int64))]))
        return out
'''

# a caller in an environment without CUDA: its BLS results come in host memory
CPU_CALLER = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            reply = pb_utils.InferenceRequest(model_name="producer", requested_output_names=["Y"],
                                              inputs=[pb_utils.get_input_tensor_by_name(request, "N")]).exec()
            if reply.has_error():
                raise RuntimeError(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "Y")
            ok = y.is_cpu() and bool((y.as_numpy() == 1.5).all())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([int(ok)], np.int64))]))
        return out
'''

HOLDER = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        import json
        fake_cuda.install()
        self.dir = json.loads(args["model_config"])["parameters"]["hold_dir"]["string_value"]

    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y")
            assert not y.is_cpu()
            open(os.path.join(self.dir, "started"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(self.dir, "go")) and time.monotonic() < deadline:
                time.sleep(0.01)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Z", np.ones(1, np.float32))]))
        return out
'''

_TYPES = {"FP32": "TYPE_FP32", "INT64": "TYPE_INT64", "INT32": "TYPE_INT32"}
DEVICE_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n'


def _io(kind: str, items) -> str:
    return "%s [ %s ]\n" % (kind, ", ".join('{ name: "%s" data_type: %s dims: [ %s ] }'
                                            % (n, _TYPES[t], ", ".join(map(str, d))) for n, t, d in items))


def _model(repo: Path, name: str, source: str, inputs, outputs, extra: str = "") -> None:
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(source)
    shutil.copy(fake_cuda.__file__, version / "fake_cuda.py")
    (repo / name / "config.pbtxt").write_text('name: "%s"\nbackend: "python"\n' % name + _io("input", inputs)
                                              + _io("output", outputs) + extra)


def _ensemble(repo: Path, name: str, inputs, outputs, steps) -> None:
    text = []
    for model, input_map, output_map in steps:
        maps = "".join(' input_map { key: "%s" value: "%s" }' % kv for kv in input_map.items())
        maps += "".join(' output_map { key: "%s" value: "%s" }' % kv for kv in output_map.items())
        text.append('  { model_name: "%s" model_version: -1%s }' % (model, maps))
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text('name: "%s"\nplatform: "ensemble"\n' % name + _io("input", inputs)
                                              + _io("output", outputs)
                                              + "ensemble_scheduling { step [\n%s\n] }\n" % ",\n".join(text))


def _infer(server, model, arrays):
    client = server.http_client(network_timeout=60.0)
    try:
        inputs = []
        for name, array in arrays.items():
            inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            inp.set_data_from_numpy(array)
            inputs.append(inp)
        return client.infer(model, inputs)
    finally:
        client.close()


def _wait_released(server, pid: int) -> None:
    server.wait_until(lambda: not fake_cuda.leftover(pid), 30,
                      "every device allocation of worker %d released: %s" % (pid, fake_cuda.leftover(pid)))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    n, y = [("N", "INT64", [1])], [("Y", "FP32", [-1])]
    _model(repo, "producer", PRODUCER, n, y)
    _model(repo, "checker", CHECKER, y, [("OK", "INT64", [1])], DEVICE_INPUTS)
    _model(repo, "consumer", CONSUMER, n, [("REPORT", "INT64", [4])])
    _model(repo, "cpu_caller", CPU_CALLER, n, [("OK", "INT64", [1])])
    out = [("Z", "FP32", [-1]), ("ONDEV", "INT32", [1])]
    _model(repo, "plus_one_gpu", PLUS_ONE, y, out, DEVICE_INPUTS)
    _model(repo, "plus_one_cpu", PLUS_ONE, y, out)
    for name in ("plus_one_gpu", "plus_one_cpu"):
        _ensemble(repo, "pipe_" + name, n, out, [("producer", {"N": "N"}, {"Y": "y"}),
                                                 (name, {"Y": "y"}, {"Z": "Z", "ONDEV": "ONDEV"})])
    # the same one-instance model twice: its second step gets its own device memory back
    _ensemble(repo, "pipe_twice", n, out, [("producer", {"N": "N"}, {"Y": "y"}),
                                           ("plus_one_gpu", {"Y": "y"}, {"Z": "z1"}),
                                           ("plus_one_gpu", {"Y": "z1"}, {"Z": "Z", "ONDEV": "ONDEV"})])
    return repo


def test_device_tensors_between_workers(server_factory, repo: Path) -> None:
    server = server_factory(repo=repo, wait_ready=["consumer", "cpu_caller", "pipe_plus_one_gpu", "pipe_plus_one_cpu",
                                                    "pipe_twice"])
    producer = server.worker_pids("producer")[0]
    n = np.array([300_000], np.int64)  # 1.2 MB: far above the inline and shared-memory thresholds

    for _ in range(2):  # BLS, both ways; the second round reuses the producer's released memory
        on_device, right, given, own = (int(v) for v in _infer(server, "consumer", {"N": n}).as_numpy("REPORT"))
        assert (on_device, right, given, own) == (1, 1, 1, 1)
        _wait_released(server, producer)

    assert _infer(server, "cpu_caller", {"N": n}).as_numpy("OK")[0] == 1  # a caller without CUDA: host bytes
    _wait_released(server, producer)

    result = _infer(server, "pipe_plus_one_gpu", {"N": n})  # ensemble: the step's input stays on the device
    np.testing.assert_array_equal(result.as_numpy("Z"), np.full(300_000, 2.5, np.float32))
    assert result.as_numpy("ONDEV")[0] == 1
    result = _infer(server, "pipe_plus_one_cpu", {"N": n})  # FORCE_CPU_ONLY_INPUT_TENSORS "yes" (default)
    np.testing.assert_array_equal(result.as_numpy("Z"), np.full(300_000, 2.5, np.float32))
    assert result.as_numpy("ONDEV")[0] == 0
    result = _infer(server, "pipe_twice", {"N": n})
    np.testing.assert_array_equal(result.as_numpy("Z"), np.full(300_000, 3.5, np.float32))
    assert result.as_numpy("ONDEV")[0] == 1
    _wait_released(server, producer)
    for model in ("plus_one_gpu", "plus_one_cpu"):  # their device outputs went to the client as host bytes
        _wait_released(server, server.worker_pids(model)[0])


def test_producer_killed_while_consumer_holds_its_memory(server_factory, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    hold = tmp_path / "hold"
    hold.mkdir()
    _model(repo, "producer", PRODUCER, [("N", "INT64", [1])], [("Y", "FP32", [-1])])
    _model(repo, "holder", HOLDER, [("Y", "FP32", [-1])], [("Z", "FP32", [1])],
           DEVICE_INPUTS + 'parameters { key: "hold_dir" value: { string_value: "%s" } }\n' % hold)
    _ensemble(repo, "hold_pipe", [("N", "INT64", [1])], [("Z", "FP32", [1])],
              [("producer", {"N": "N"}, {"Y": "y"}), ("holder", {"Y": "y"}, {"Z": "Z"})])
    server = server_factory(repo=repo, wait_ready=["hold_pipe"])
    producer = server.worker_pids("producer")[0]
    holder = server.worker_pids("holder")[0]
    n = np.array([1000], np.int64)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_infer, server, "hold_pipe", {"N": n})
        deadline = time.monotonic() + 60
        while not (hold / "started").exists():
            assert time.monotonic() < deadline and not pending.done(), "the holder never got the device tensor"
            time.sleep(0.02)
        os.kill(producer, signal.SIGKILL)
        server.wait_until(lambda: producer not in server.worker_pids("producer"), 60, "the producer reaped")
        (hold / "go").touch()
        with pytest.raises(InferenceServerException) as err:
            pending.result(timeout=60)
    assert "producer_0" in str(err.value) and "died" in str(err.value)
    assert holder in server.worker_pids("holder")
    for name in fake_cuda.leftover(producer):  # what the killed producer left (a dead GPU process frees its memory)
        os.unlink("/dev/shm/" + name)
    server.wait_model_ready("producer", timeout=60)
    server.wait_until(lambda: server.worker_pids("producer"), 60, "the producer restarted")
    assert _infer(server, "hold_pipe", {"N": n}).as_numpy("Z")[0] == 1.0
    _wait_released(server, server.worker_pids("producer")[0])
