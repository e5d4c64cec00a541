"""Triton's onnxruntime backend: `model.onnx` (a file, or a directory holding model.onnx plus its
external data) run by an onnxruntime InferenceSession.

- Execution providers: CPU; on a KIND_GPU instance CUDA (device `device_id`), and TensorRT first when
  `optimization { execution_accelerators { gpu_execution_accelerator: [{ name: "tensorrt" }] } }`
  asks for it. A GPU instance without onnxruntime-gpu is UNAVAILABLE with the install hint.
- `parameters`: intra_op_thread_count (unset: the CPUs the worker runs on when fewer than the host's,
  else ORT's default), inter_op_thread_count, execution_mode (0 sequential, 1 parallel), enable_mem_arena /
  enable_mem_pattern (0/1); `optimization { graph { level } }`: -1 basic, 0 (default) all, 1 extended.
- Auto-complete (triton.md §4.3): inputs and outputs the config lacks are added with the model's
  datatypes and dims; with no I/O and no max_batch_size configured, a model whose every input and
  output has a dynamic first dimension gets max_batch_size 4 (Triton's default-max-batch-size) and
  dynamic batching.
- Ragged batching (`allow_ragged_batch`, `batch_input`, `batch_output`; ragged.py): a ragged input must be
  [-1] in the model and gets every request's elements in one 1-D tensor; batch inputs are fed under their
  target names; batch outputs are scattered back by their source input's shape.
- A batch of requests is concatenated along dim 0 into one session run and split back. One request
  with every input of the model, on a CPU session, takes a shorter path (`_execute_one`): the request's
  arrays go straight to the session's native `run` (the Python wrapper's per-call checks are done once
  at load), and its outputs become Tensors by a datatype looked up once per output.
- A KIND_GPU instance runs with I/O binding: device inputs (another worker's output, opened by CUDA IPC
  handle) are bound where they are, host inputs are bound from the host, and outputs are bound to the
  GPU and left there (the runtime passes them on by handle, or copies them out for a client). Device
  inputs are not concatenated: a batch holding them runs request by request.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from ..wire.errors import ErrorCode, InferdError
from . import framework, ragged
from .base import ModelSpec, Request, Response, Tensor, WorkerContext

DEFAULT_MODEL_FILENAME = "model.onnx"
DEFAULT_MAX_BATCH_SIZE = 4

_ORT_TYPES = {
    "tensor(bool)": "TYPE_BOOL", "tensor(uint8)": "TYPE_UINT8", "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32", "tensor(uint64)": "TYPE_UINT64", "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16", "tensor(int32)": "TYPE_INT32", "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16", "tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING", "tensor(bfloat16)": "TYPE_BF16",
}


def _onnx_file(spec: ModelSpec) -> str:
    path = framework.model_path(spec, DEFAULT_MODEL_FILENAME)
    if os.path.isdir(path):  # model.onnx/ holding model.onnx + external data files
        inner = os.path.join(path, DEFAULT_MODEL_FILENAME)
        if not os.path.isfile(inner):
            raise InferdError(ErrorCode.NOT_FOUND, "directory '%s' holds no %s" % (path, DEFAULT_MODEL_FILENAME))
        return inner
    return path


def _dims(shape: Any) -> list[int]:
    return [int(d) if isinstance(d, int) and d >= 0 else -1 for d in (shape or [])]


def _session_options(ort: Any, config: dict[str, Any]) -> Any:
    options = ort.SessionOptions()
    intra = framework.int_parameter(config, "intra_op_thread_count", 0)
    inter = framework.int_parameter(config, "inter_op_thread_count", 0)
    if intra <= 0:  # not set by the model: one thread per CPU the worker runs on (ORT counts the host's)
        intra = framework.cpu_threads()
    if intra > 0:
        options.intra_op_num_threads = intra
    if inter > 0:
        options.inter_op_num_threads = inter
    if framework.int_parameter(config, "execution_mode", 0) == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    if framework.parameter(config, "enable_mem_arena", "").strip() == "0":
        options.enable_cpu_mem_arena = False
    if framework.parameter(config, "enable_mem_pattern", "").strip() == "0":
        options.enable_mem_pattern = False
    level = int(((config.get("optimization") or {}).get("graph") or {}).get("level", 0) or 0)
    options.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return options


def _providers(ort: Any, spec: ModelSpec) -> list[Any]:
    if spec.instance_kind != "GPU":
        return ["CPUExecutionProvider"]
    available = set(ort.get_available_providers())
    if "CUDAExecutionProvider" not in available:
        raise InferdError(ErrorCode.UNAVAILABLE,
                          "model '%s' asks for a GPU instance but this onnxruntime has no CUDA execution "
                          "provider: pip install 'inferd[gpu]'" % spec.model_name)
    providers: list[Any] = []
    for accel in framework.gpu_accelerators(spec.config):
        if accel.get("name") == "tensorrt" and "TensorrtExecutionProvider" in available:
            params = {k: str(v) for k, v in (accel.get("parameters") or {}).items()}
            params["device_id"] = str(spec.device_id)
            providers.append(("TensorrtExecutionProvider", params))
    providers.append(("CUDAExecutionProvider", {"device_id": str(spec.device_id)}))
    providers.append("CPUExecutionProvider")
    return providers


_ORT_DATATYPES = {  # OrtValue.data_type() -> protocol datatype, for outputs left on the GPU
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
}


class OnnxRuntimeBackend:
    name = "onnxruntime"
    supports_auto_complete = True
    supports_decoupled = False
    device_inputs = False  # True on a GPU instance bound with I/O binding

    def __init__(self) -> None:
        self._session: Any = None
        self._spec: Optional[ModelSpec] = None
        self._batching = False
        self._outputs: list[str] = []
        self._string_inputs: set[str] = set()
        self._run_native: Any = None  # the session's C++ run(names, feeds, options) for _execute_one
        self._required: frozenset[str] = frozenset()  # inputs the model cannot run without
        self._out_types: dict[str, str] = {}  # output name -> protocol datatype the model returns
        self._ragged: Optional[ragged.RaggedPlan] = None  # the config's ragged batching, if any

    # ---- auto-complete ---------------------------------------------------------------------------

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        ort = framework.import_framework("onnxruntime", self.name)
        session = ort.InferenceSession(_onnx_file(model), providers=["CPUExecutionProvider"])
        inputs, outputs = session.get_inputs(), session.get_outputs()
        have_in = {i.get("name") for i in config.get("input") or []}
        have_in.update(t for b in config.get("batch_input") or [] for t in b.get("target_name") or [])
        have_out = {o.get("name") for o in config.get("output") or []}
        mbs = int(config.get("max_batch_size") or 0)
        if not have_in and not have_out and mbs == 0:
            shapes = [_dims(t.shape) for t in list(inputs) + list(outputs)]
            if shapes and all(s and s[0] == -1 for s in shapes):
                mbs = DEFAULT_MAX_BATCH_SIZE
                config["max_batch_size"] = mbs
                scheduled = any(k in config for k in ("dynamic_batching", "sequence_batching",
                                                      "ensemble_scheduling"))
                if mbs > 1 and not scheduled:
                    config["dynamic_batching"] = {}
        skip = 1 if mbs > 0 else 0
        for key, tensors, have in (("input", inputs, have_in), ("output", outputs, have_out)):
            entries = list(config.get(key) or [])
            for t in tensors:
                if t.name in have:
                    continue
                data_type = _ORT_TYPES.get(t.type)
                if data_type is None:
                    raise InferdError(ErrorCode.UNSUPPORTED, "model '%s': %s '%s' has unsupported type %s"
                                      % (model.model_name, key, t.name, t.type))
                dims = _dims(t.shape)[skip:] or [1]
                entries.append({"name": t.name, "data_type": data_type, "dims": dims})
            config[key] = entries
        return config

    # ---- load / execute / unload -----------------------------------------------------------------

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        ort = framework.import_framework("onnxruntime", self.name)
        path = _onnx_file(model)
        try:
            self._session = ort.InferenceSession(path, sess_options=_session_options(ort, model.config),
                                                 providers=_providers(ort, model))
        except InferdError:
            raise
        except Exception as exc:
            raise InferdError(ErrorCode.INVALID_ARG, "failed to load model '%s' from '%s': %s"
                              % (model.model_name, path, exc)) from None
        self._spec = model
        self._batching = int(model.config.get("max_batch_size") or 0) > 0
        self._ragged = ragged.RaggedPlan.from_config(model.model_name, model.config)
        self._check_ragged_inputs(model)
        self._outputs = model.output_names or [o.name for o in self._session.get_outputs()]
        self._string_inputs = {i.name for i in self._session.get_inputs() if i.type == "tensor(string)"}
        # I/O binding needs numeric outputs (no strings on a device) and the CUDA provider in use
        self._gpu = (model.instance_kind == "GPU" and "CUDAExecutionProvider" in self._session.get_providers()
                     and all(o.type in _ORT_DATATYPES for o in self._session.get_outputs()))
        self._device_id = model.device_id
        self._bind_device = "cuda"  # where I/O binding puts device tensors (tests bind "cpu" memory the same way)
        self.device_inputs = self._gpu
        self._prepare_fast_path()

    def _check_ragged_inputs(self, model: ModelSpec) -> None:
        """As Triton's onnxruntime backend: a ragged input is [-1] in the model and never optional."""
        if self._ragged is None:
            return
        shapes = {i.name: _dims(i.shape) for i in self._session.get_inputs()}
        for entry in model.config.get("input") or []:
            name = entry.get("name")
            if name not in self._ragged.ragged:
                continue
            if entry.get("optional"):
                raise InferdError(ErrorCode.INVALID_ARG, "unable to load model '%s', configuration expects model "
                                  "provides input with shape [-1] for ragged input '%s', which is not supported "
                                  "for optional input" % (model.model_name, name))
            if name in shapes and shapes[name] != [-1]:
                raise InferdError(ErrorCode.INVALID_ARG, "unable to load model '%s', configuration expects model "
                                  "provides input with shape [-1] for ragged input '%s', model provides %s"
                                  % (model.model_name, name, shapes[name]))

    def _prepare_fast_path(self) -> None:
        """What `_execute_one` needs: the native run (CPU sessions only: the wrapper's provider fallback
        is for GPU ones), the required input names, and each numeric output's protocol datatype."""
        session = self._session
        self._run_native = None
        if (self._gpu or self._string_inputs or self._ragged is not None
                or session.get_providers() != ["CPUExecutionProvider"]
                or not callable(getattr(getattr(session, "_sess", None), "run", None))):
            return
        self._required = frozenset(i.name for i in session.get_inputs() if not i.type.startswith("optional"))
        types = {o.name: _ORT_DATATYPES.get(o.type) for o in session.get_outputs()}
        if not all(types.get(name) for name in self._outputs):
            return  # string, sequence or map outputs: the general path converts them
        self._out_types = {name: str(types[name]) for name in self._outputs}
        self._run_native = session._sess.run

    def execute(self, requests: list[Request]) -> list[Response]:
        if len(requests) == 1 and self._run_native is not None and not self._gpu:
            response = self._execute_one(requests[0])
            if response is not None:
                return [response]
        plan = self._ragged
        merged = framework.batch_requests(requests, self._batching) if plan is None else plan.feeds(requests)
        if merged is None:  # mixed shapes: one run per request
            return [self.execute([request])[0] for request in requests]
        feeds, sizes = merged
        for name in self._string_inputs & set(feeds):
            feeds[name] = np.array([b.decode("utf-8") if isinstance(b, bytes) else b
                                    for b in feeds[name].reshape(-1)], dtype=object).reshape(feeds[name].shape)
        names = framework.wanted_outputs(requests, self._outputs)
        try:
            results = self._run_bound(names, feeds) if self._gpu else self._session.run(names, feeds)
        except Exception as exc:
            model = self._spec.model_name if self._spec else ""
            error = InferdError(ErrorCode.INTERNAL, "onnxruntime failed to run model '%s': %s" % (model, exc))
            return [Response(error=error) for _ in requests]
        split = framework.split_batch if plan is None else plan.split
        return split(requests, list(zip(names, results)), sizes, self._outputs)

    def _execute_one(self, request: Request) -> Optional[Response]:
        """One request on a CPU session, as `execute` would run it; None when it needs the general path
        (an input set other than the model's, or outputs of another type than the model declares)."""
        inputs = request.inputs
        feeds = {}
        for t in inputs:  # a loop, not a comprehension: no function call
            feeds[t.name] = t.array
        if len(feeds) != len(inputs) or not self._required.issubset(feeds):
            return None  # the wrapper's run names what is missing
        wanted = request.requested_outputs
        names = self._outputs if not wanted else framework.wanted_outputs([request], self._outputs)
        try:
            results = self._run_native(names, feeds, None)
        except Exception as exc:
            model = self._spec.model_name if self._spec else ""
            error = InferdError(ErrorCode.INTERNAL, "onnxruntime failed to run model '%s': %s" % (model, exc))
            return Response(error=error)
        types = self._out_types
        outputs = []
        for name, array in zip(names, results):
            datatype = types.get(name)
            if datatype is None or type(array) is not np.ndarray or array.dtype.kind in "OUS":
                return framework.split_batch([request], list(zip(names, results)), [1], self._outputs)[0]
            outputs.append(Tensor(name, datatype, array))
        return Response(outputs)

    def _run_bound(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
        """One run with I/O binding on this instance's GPU; outputs as DeviceArrays over the OrtValues."""
        from .. import device

        binding = self._session.io_binding()
        for name, value in feeds.items():
            if type(value) is np.ndarray:
                binding.bind_cpu_input(name, value)
            elif value.datatype == "BF16":  # numpy has no bfloat16 dtype to describe it: go through the host
                binding.bind_cpu_input(name, value.to_numpy())
            else:
                dtype = np.dtype(np.bool_) if value.datatype == "BOOL" else np.dtype(
                    device._TYPESTR[value.datatype])
                binding.bind_input(name, self._bind_device, value.device, dtype, list(value.shape), value.ptr)
        for name in names:
            binding.bind_output(name, self._bind_device, self._device_id)
        self._session.run_with_iobinding(binding)
        outputs = []
        for name, value in zip(names, binding.get_outputs()):
            datatype = _ORT_DATATYPES.get(value.data_type())
            if datatype is None:
                raise InferdError(ErrorCode.INTERNAL, "output '%s' has unsupported type %s" % (name, value.data_type()))
            shape = tuple(int(d) for d in value.shape())
            count = 1
            for d in shape:
                count *= d
            itemsize = 1 if datatype == "BOOL" else np.dtype(device._TYPESTR[datatype]).itemsize
            outputs.append(device.DeviceArray(int(value.data_ptr()), count * itemsize, shape, datatype,
                                              self._device_id, value))  # the OrtValue keeps the memory
        return outputs

    def unload(self) -> Optional[InferdError]:
        self._session = None
        return None
