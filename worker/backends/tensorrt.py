"""Triton's tensorrt backend (`platform: "tensorrt_plan"`, `model.plan`): GPU only.

Where no NVIDIA GPU or no `tensorrt` package is present the model is UNAVAILABLE with the reason
"TensorRT needs an NVIDIA GPU" (never a crash). With both present, the engine is deserialized on the
instance's device, auto-complete reads its I/O tensors (a dynamic first dimension gives
max_batch_size from the optimization profile, capped at 4 as Triton's default), and execution runs
through torch CUDA tensors as device buffers (execute_async_v3).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from ..wire.errors import ErrorCode, InferdError
from . import framework
from .base import ModelSpec, Request, Response, WorkerContext

DEFAULT_MODEL_FILENAME = "model.plan"
DEFAULT_MAX_BATCH_SIZE = 4
NO_GPU = "TensorRT needs an NVIDIA GPU"


def _gpu_count() -> int:
    """NVIDIA GPUs visible to this process, without importing a CUDA library when there is none."""
    if not os.path.exists("/dev/nvidiactl") and not os.path.exists("/proc/driver/nvidia/version"):
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:
        return 1


def _require(model: ModelSpec) -> tuple[Any, Any]:
    """(tensorrt, torch) or UNAVAILABLE with the reason."""
    if _gpu_count() == 0:
        raise InferdError(ErrorCode.UNAVAILABLE, "%s; model '%s' cannot load on this machine"
                          % (NO_GPU, model.model_name))
    try:
        import tensorrt as trt
        import torch
    except ImportError as exc:
        raise InferdError(ErrorCode.UNAVAILABLE, "%s with the tensorrt and torch packages (%s): "
                          "pip install 'inferd[gpu]'" % (NO_GPU, exc)) from None
    return trt, torch


def _trt_datatype(trt: Any, dtype: Any) -> str:
    table = {trt.float32: "TYPE_FP32", trt.float16: "TYPE_FP16", trt.int32: "TYPE_INT32", trt.int8: "TYPE_INT8",
             trt.bool: "TYPE_BOOL"}
    for name, config_type in (("int64", "TYPE_INT64"), ("bf16", "TYPE_BF16"), ("uint8", "TYPE_UINT8")):
        if hasattr(trt, name):
            table[getattr(trt, name)] = config_type
    if dtype not in table:
        raise InferdError(ErrorCode.UNSUPPORTED, "unsupported TensorRT datatype %s" % dtype)
    return table[dtype]


def _deserialize(trt: Any, model: ModelSpec) -> Any:
    path = framework.model_path(model, DEFAULT_MODEL_FILENAME)
    logger = trt.Logger(trt.Logger.WARNING)
    with open(path, "rb") as f:
        engine = trt.Runtime(logger).deserialize_cuda_engine(f.read())
    if engine is None:
        raise InferdError(ErrorCode.INVALID_ARG, "unable to deserialize TensorRT engine '%s'" % path)
    return engine


def _io(trt: Any, engine: Any) -> tuple[list[str], list[str]]:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    return inputs, [n for n in names if n not in inputs]


class TensorRTBackend:
    name = "tensorrt"
    supports_auto_complete = True
    supports_decoupled = False

    def __init__(self) -> None:
        self._engine: Any = None
        self._context: Any = None
        self._torch: Any = None
        self._device: Any = None
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._spec: Optional[ModelSpec] = None

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        trt, _ = _require(model)
        engine = _deserialize(trt, model)
        inputs, outputs = _io(trt, engine)
        shapes = {n: [int(d) for d in engine.get_tensor_shape(n)] for n in inputs + outputs}
        have = {t.get("name") for key in ("input", "output") for t in config.get(key) or []}
        mbs = int(config.get("max_batch_size") or 0)
        if not have and mbs == 0 and all(s and s[0] == -1 for s in shapes.values()):
            profile_max = int(engine.get_tensor_profile_shape(inputs[0], 0)[2][0]) if inputs else 1
            mbs = max(1, min(DEFAULT_MAX_BATCH_SIZE, profile_max))
            config["max_batch_size"] = mbs
            if mbs > 1 and "dynamic_batching" not in config and "sequence_batching" not in config:
                config["dynamic_batching"] = {}
        skip = 1 if mbs > 0 else 0
        for key, names in (("input", inputs), ("output", outputs)):
            entries = list(config.get(key) or [])
            for n in names:
                if n not in have:
                    entries.append({"name": n, "data_type": _trt_datatype(trt, engine.get_tensor_dtype(n)),
                                    "dims": shapes[n][skip:] or [1]})
            config[key] = entries
        return config

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        trt, torch = _require(model)
        self._torch = torch
        self._device = torch.device("cuda", model.device_id)
        torch.cuda.set_device(self._device)
        self._engine = _deserialize(trt, model)
        self._context = self._engine.create_execution_context()
        self._inputs, self._outputs = _io(trt, self._engine)
        self._spec = model

    def execute(self, requests: list[Request]) -> list[Response]:
        return [self._run(request) for request in requests]

    def _run(self, request: Request) -> Response:
        torch = self._torch
        try:
            stream = torch.cuda.current_stream(self._device)
            keep = []
            for tensor in request.inputs:
                gpu = torch.from_numpy(np.ascontiguousarray(tensor.array)).to(self._device)
                keep.append(gpu)
                self._context.set_input_shape(tensor.name, tuple(gpu.shape))
                self._context.set_tensor_address(tensor.name, gpu.data_ptr())
            outs = []
            for name in self._outputs:
                shape = tuple(self._context.get_tensor_shape(name))
                dtype = torch.from_numpy(np.zeros(0, _numpy_dtype(self._engine.get_tensor_dtype(name)))).dtype
                out = torch.empty(shape, dtype=dtype, device=self._device)
                self._context.set_tensor_address(name, out.data_ptr())
                outs.append((name, out))
            if not self._context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError("execute_async_v3 failed")
            stream.synchronize()
            arrays = [(name, out.cpu().numpy()) for name, out in outs]
        except Exception as exc:
            model = self._spec.model_name if self._spec else ""
            return Response(error=InferdError(ErrorCode.INTERNAL, "TensorRT failed to run model '%s': %s"
                                              % (model, exc)))
        return framework.split_batch([request], arrays, [0], self._outputs)[0]

    def unload(self) -> Optional[InferdError]:
        self._context = None
        self._engine = None
        return None


def _numpy_dtype(trt_dtype: Any) -> Any:
    import tensorrt as trt

    return np.dtype(trt.nptype(trt_dtype))
