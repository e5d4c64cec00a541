"""Triton's pytorch backend for TorchScript (`platform: "pytorch_libtorch"`, `model.pt`).

- Inputs: when every configured input is named `<name>__<index>` (INPUT__0, INPUT__1...) the index is the
  position in forward(); otherwise the names must be forward()'s argument names. Outputs: named
  `<name>__<index>` -> the index-th returned tensor; otherwise the config order. forward() may return
  a tensor, or a tuple / list of tensors.
- parameters: INTRA_OP_THREAD_COUNT, INTER_OP_THREAD_COUNT, INFERENCE_MODE (default true),
  DISABLE_OPTIMIZED_EXECUTION (keys also accepted in lower case).
- CPU instances run on the CPU; KIND_GPU instances on cuda:<device_id> (UNAVAILABLE without CUDA). A GPU
  instance takes device inputs as they are (another worker's output, opened by CUDA IPC handle: no host
  copy) and leaves its outputs on the device; the runtime passes them on by handle to another worker,
  or copies them to the host for a client.
- No auto-complete (TorchScript does not describe its I/O): the config must list inputs and outputs.
- A batch of requests is concatenated along dim 0 into one forward() call and split back.
- Ragged batching (ragged.py): a ragged input gets every request's elements in one 1-D tensor; a
  batch_input's target names take forward() positions as the configured inputs do (argument names, or
  `<name>__<index>`); batch outputs are scattered back by their source input's shape.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Optional

import numpy as np

from ..wire.errors import ErrorCode, InferdError
from . import framework, ragged
from .base import ModelSpec, Request, Response, WorkerContext

DEFAULT_MODEL_FILENAME = "model.pt"
_INDEXED = re.compile(r"^.+__(\d+)$")


def _param(config: dict[str, Any], key: str) -> str:
    return framework.parameter(config, key) or framework.parameter(config, key.lower())


def _flag(config: dict[str, Any], key: str, default: bool) -> bool:
    text = _param(config, key).strip().lower()
    return default if not text else text in ("1", "true", "yes", "on")


def _indices(names: list[str]) -> Optional[list[int]]:
    """Positions from `<name>__<index>` names, or None unless all follow the convention."""
    found = [_INDEXED.match(n) for n in names]
    if not names or not all(found):
        return None
    return [int(m.group(1)) for m in found if m]


def _forward_args(module: Any) -> list[str]:
    try:
        arguments = module.forward.schema.arguments
        return [a.name for a in arguments if a.name != "self"]
    except Exception:
        return []


class PyTorchBackend:
    name = "pytorch"
    supports_auto_complete = False
    supports_decoupled = False
    device_inputs = False  # True on a GPU instance (see the module docstring)

    def __init__(self) -> None:
        self._torch: Any = None
        self._module: Any = None
        self._spec: Optional[ModelSpec] = None
        self._device: Any = None
        self._batching = False
        self._positions: dict[str, int] = {}  # input name -> forward() position
        self._arity = 0
        self._outputs: list[str] = []
        self._output_index: dict[str, int] = {}
        self._inference_mode = True
        self._ragged: Optional[ragged.RaggedPlan] = None

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        return config

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        torch = framework.import_framework("torch", self.name)
        self._torch = torch
        config = model.config
        intra = framework.int_parameter(config, "INTRA_OP_THREAD_COUNT", 0) or \
            framework.int_parameter(config, "intra_op_thread_count", 0)
        inter = framework.int_parameter(config, "INTER_OP_THREAD_COUNT", 0) or \
            framework.int_parameter(config, "inter_op_thread_count", 0)
        if intra > 0:
            torch.set_num_threads(intra)
        if inter > 0:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:
                pass  # only settable before the first parallel work in this process
        self._inference_mode = _flag(config, "INFERENCE_MODE", True)
        if _flag(config, "DISABLE_OPTIMIZED_EXECUTION", False):
            torch._C._set_graph_executor_optimize(False)
        if model.instance_kind == "GPU":
            if not torch.cuda.is_available():
                raise InferdError(ErrorCode.UNAVAILABLE, "model '%s' asks for a GPU instance but torch sees no "
                                  "CUDA device" % model.model_name)
            self._device = torch.device("cuda", model.device_id)
            self.device_inputs = True
        else:
            self._device = torch.device("cpu")
        path = framework.model_path(model, DEFAULT_MODEL_FILENAME)
        try:
            self._module = torch.jit.load(path, map_location=self._device).eval()
        except Exception as exc:
            raise InferdError(ErrorCode.INVALID_ARG, "failed to load TorchScript model '%s' from '%s': %s"
                              % (model.model_name, path, exc)) from None
        self._spec = model
        self._batching = int(config.get("max_batch_size") or 0) > 0
        self._ragged = ragged.RaggedPlan.from_config(model.model_name, config)
        self._map_inputs(model)
        self._outputs = model.output_names
        indices = _indices(self._outputs)
        self._output_index = dict(zip(self._outputs, indices if indices is not None else range(len(self._outputs))))
        # inputs are read-only views of the wire buffers; the module gets them without a copy
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def _map_inputs(self, model: ModelSpec) -> None:
        inputs = model.config.get("input") or []
        names = [i["name"] for i in inputs if "name" in i]
        for i in inputs:
            if i.get("data_type") == "TYPE_STRING":
                raise InferdError(ErrorCode.UNSUPPORTED, "model '%s': input '%s' is TYPE_STRING, which this "
                                  "pytorch backend does not support" % (model.model_name, i["name"]))
        targets = self._ragged.targets if self._ragged is not None else []
        indices = _indices(names)
        if indices is not None:
            target_indices = _indices(targets)
            if targets and target_indices is None:
                raise InferdError(ErrorCode.INVALID_ARG, "model '%s': the inputs follow the naming convention "
                                  "<name>__<index>, the batch_input target names %s must too"
                                  % (model.model_name, targets))
            self._positions = dict(zip(names + targets, indices + (target_indices or [])))
        else:
            args = _forward_args(self._module)
            missing = [n for n in names + targets if n not in args]
            if missing:
                raise InferdError(ErrorCode.INVALID_ARG, "model '%s': input '%s' follows neither the naming "
                                  "convention <name>__<index> nor a forward() argument name (%s)"
                                  % (model.model_name, missing[0], ", ".join(args)))
            self._positions = {n: args.index(n) for n in names + targets}
        self._arity = max(self._positions.values()) + 1 if self._positions else 0

    def _tensor(self, array: Any) -> Any:
        """An input as a torch tensor on this instance's device (device memory is not copied)."""
        torch = self._torch
        if isinstance(array, torch.Tensor):
            return array
        if type(array) is not np.ndarray:  # a device.DeviceArray: a zero-copy view
            tensor = array.to_torch()
            return tensor if tensor.device == self._device else tensor.to(self._device)
        tensor = torch.from_numpy(array)
        return tensor.to(self._device) if self._device.type != "cpu" else tensor

    def _concat(self, arrays: list[Any]) -> Any:
        return self._torch.cat([self._tensor(a) for a in arrays], dim=0)

    def _output(self, tensor: Any) -> Any:
        """A returned tensor: numpy on a CPU instance; on a GPU instance it stays on the device."""
        tensor = tensor.detach()
        if tensor.is_cuda:
            from .. import device

            return device.from_object(tensor.contiguous(), "output")
        return np.asarray(tensor.cpu().numpy())

    def execute(self, requests: list[Request]) -> list[Response]:
        concat = self._concat if self._device.type != "cpu" else None
        plan = self._ragged
        merged = (framework.batch_requests(requests, self._batching, concat) if plan is None
                  else plan.feeds(requests, concat))
        if merged is None:
            return [self.execute([request])[0] for request in requests]
        feeds, sizes = merged
        torch = self._torch
        try:
            args: list[Any] = [None] * self._arity
            for name, array in feeds.items():
                position = self._positions.get(name)
                if position is None:
                    raise InferdError(ErrorCode.INVALID_ARG, "unexpected input '%s'" % name)
                args[position] = self._tensor(array)
            context = torch.inference_mode() if self._inference_mode else torch.no_grad()
            with context:
                result = self._module(*args)
            tensors = list(result) if isinstance(result, (tuple, list)) else [result]
            outputs = []
            for name in framework.wanted_outputs(requests, self._outputs):
                index = self._output_index.get(name, -1)
                if not 0 <= index < len(tensors):
                    raise InferdError(ErrorCode.INTERNAL, "output '%s' has no returned tensor at index %d (forward "
                                      "returned %d)" % (name, index, len(tensors)))
                outputs.append((name, self._output(tensors[index])))
        except Exception as exc:
            model = self._spec.model_name if self._spec else ""
            message = exc.message if isinstance(exc, InferdError) else "%s: %s" % (type(exc).__name__, exc)
            error = InferdError(ErrorCode.INTERNAL, "PyTorch failed to run model '%s': %s" % (model, message))
            return [Response(error=error) for _ in requests]
        split = framework.split_batch if plan is None else plan.split
        return split(requests, outputs, sizes, self._outputs)

    def unload(self) -> Optional[InferdError]:
        self._module = None
        return None
