"""GPU Python models for tests/gpu and bench/gpu_ipc.py, written into a repository on the spot.

Every model runs on `instance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]` and uses torch on
cuda:0 (the instance's device). Device tensors go out with `pb_utils.Tensor.from_dlpack` and come in
through `to_dlpack`, as Triton users write them.
"""

from __future__ import annotations

from pathlib import Path

GPU_GROUP = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
DEVICE_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n'
_TYPES = {"FP32": "TYPE_FP32", "INT64": "TYPE_INT64", "BF16": "TYPE_BF16", "INT32": "TYPE_INT32"}

HEADER = '''
import os, time
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


def on_gpu(tensor):
    """A pb_utils.Tensor as a torch tensor, zero-copy (device or host memory alike)."""
    return torch.from_dlpack(tensor.to_dlpack())
'''

# Y = 2 * X computed on the GPU; the output is a device tensor (from_dlpack of a CUDA tensor)
DOUBLE = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            y = on_gpu(x).to("cuda:0") * 2
            t = pb_utils.Tensor.from_dlpack("Y", y)
            if t.is_cpu():
                raise RuntimeError("from_dlpack moved a CUDA tensor to the CPU")
            out.append(pb_utils.InferenceResponse([t]))
        return out
'''

# Z = Y + 1, insisting that Y arrives on the GPU (FORCE_CPU_ONLY_INPUT_TENSORS "no")
PLUS_ONE_ON_GPU = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y")
            if y.is_cpu():
                raise RuntimeError("input Y produced on a GPU arrived on the CPU")
            z = on_gpu(y) + 1
            if not z.is_cuda:
                raise RuntimeError("input Y is not device memory")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Z", z)]))
        return out
'''

# A device tensor of N float32 (N from the input), filled with a value, left on the GPU
PRODUCER = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            y = torch.full((n,), 1.5, dtype=torch.float32, device="cuda:0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", y)]))
        return out
'''

# Calls `producer` by BLS for a big device tensor, passes it by BLS to `checker`, and reports what it
# saw: [is on the device, all values right, host RSS growth in bytes, handles opened by IPC here,
#        checker's verdict (1 = it got the tensor on the GPU with the right values)]
BLS_CONSUMER = HEADER + '''
from inferd.worker.wire import cuda_ipc


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            before = rss_bytes()
            reply = pb_utils.InferenceRequest(model_name="producer", requested_output_names=["Y"],
                                              inputs=[n]).exec()
            if reply.has_error():
                raise RuntimeError(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "Y")
            t = on_gpu(y)
            on_device = (not y.is_cpu()) and t.is_cuda
            right = bool((t == 1.5).all().item())
            check = pb_utils.InferenceRequest(model_name="checker", requested_output_names=["OK"],
                                              inputs=[pb_utils.Tensor.from_dlpack("Y", t)]).exec()
            if check.has_error():
                raise RuntimeError(check.error().message())
            verdict = int(pb_utils.get_output_tensor_by_name(check, "OK").as_numpy()[0])
            grown = rss_bytes() - before
            report = np.array([int(on_device), int(right), grown, cuda_ipc.opened_count(), verdict], np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", report)]))
        return out
'''

# OK = [1] when Y arrived on the GPU and holds 1.5 everywhere (FORCE_CPU_ONLY_INPUT_TENSORS "no")
CHECKER = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y")
            ok = (not y.is_cpu()) and bool((on_gpu(y) == 1.5).all().item())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([int(ok)], np.int64))]))
        return out
'''

# Holds its GPU input until the file <dir>/go exists (after writing <dir>/started): the test kills the
# producer meanwhile
HOLDER = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        import json
        self.dir = json.loads(args["model_config"])["parameters"]["hold_dir"]["string_value"]

    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y")
            open(os.path.join(self.dir, "started"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(self.dir, "go")) and time.monotonic() < deadline:
                time.sleep(0.01)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Z", np.ones(1, np.float32))]))
        return out
'''


def io(kind: str, items: list[tuple[str, str, list[int]]]) -> str:
    return "%s [ %s ]\n" % (kind, ", ".join('{ name: "%s" data_type: %s dims: [ %s ] }'
                                            % (n, _TYPES[t], ", ".join(map(str, d))) for n, t, d in items))


def python_model(repo: Path, name: str, source: str, inputs: list[tuple[str, str, list[int]]],
                 outputs: list[tuple[str, str, list[int]]], extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text('name: "%s"\nbackend: "python"\n' % name + io("input", inputs)
                                              + io("output", outputs) + GPU_GROUP + extra)


Step = tuple[str, dict[str, str], dict[str, str]]


def ensemble(repo: Path, name: str, inputs: list[tuple[str, str, list[int]]],
             outputs: list[tuple[str, str, list[int]]], steps: list[Step]) -> None:
    """`steps`: (model, {model input: tensor}, {model output: tensor})."""
    text = []
    for model, input_map, output_map in steps:
        maps = "".join(' input_map { key: "%s" value: "%s" }' % kv for kv in input_map.items())
        maps += "".join(' output_map { key: "%s" value: "%s" }' % kv for kv in output_map.items())
        text.append('  { model_name: "%s" model_version: -1%s }' % (model, maps))
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(
        'name: "%s"\nplatform: "ensemble"\n' % name + io("input", inputs) + io("output", outputs)
        + "ensemble_scheduling { step [\n%s\n] }\n" % ",\n".join(text))


def bls_repo(repo: Path) -> Path:
    """producer -> (BLS) consumer -> (BLS) checker: a big device tensor handed on twice."""
    python_model(repo, "producer", PRODUCER, [("N", "INT64", [1])], [("Y", "FP32", [-1])])
    python_model(repo, "checker", CHECKER, [("Y", "FP32", [-1])], [("OK", "INT64", [1])], DEVICE_INPUTS)
    python_model(repo, "consumer", BLS_CONSUMER, [("N", "INT64", [1])], [("REPORT", "INT64", [5])])
    return repo
