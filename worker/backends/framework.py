"""Helpers shared by the framework backends (onnxruntime, pytorch, tensorrt).

- `import_framework`: lazy import of the framework package; a missing one is UNAVAILABLE with the
  pip extra that installs it.
- `model_path`: `<model_dir>/<version>/<default_model_filename>` (a directory may hold the file).
- `parameter`: a `parameters { key: ... value: { string_value: ... } }` entry of the config.
- `batch_requests` / `split_batch`: concatenate the requests of one Execute along dim 0 into one run
  and split the outputs back, request by request.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional

import numpy as np

from ..wire import dtypes
from ..wire.errors import ErrorCode, InferdError
from .base import ModelSpec, Request, Response, Tensor

INSTALL_HINTS = {
    "onnxruntime": "pip install 'inferd[onnx]'",
    "torch": "pip install 'inferd[torch]'",
    "tensorrt": "pip install 'inferd[gpu]'",
}


def import_framework(module: str, backend: str) -> Any:
    """Import `module` or raise UNAVAILABLE naming the package and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = INSTALL_HINTS.get(module.split(".")[0], "pip install %s" % module)
        raise InferdError(
            ErrorCode.UNAVAILABLE,
            "the %s backend needs the '%s' package, which this model's Python environment lacks (%s): %s"
            % (backend, module, exc, hint),
        ) from None


def cpu_threads() -> int:
    """The number of CPUs this worker may run on when it is fewer than the host has (a --host-policy, a
    taskset or cpuset), else 0 (the frameworks' own defaults are right). The supervisor sets the
    BLAS/OpenMP variables to the same count (supervisor/instances/cpu_threads.py); this is for
    frameworks that read none of them (ONNX Runtime's intra-op pool)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 0
    host = os.cpu_count() or 0
    return cpus if 0 < cpus < host else 0


def model_path(spec: ModelSpec, default_name: str) -> str:
    """Path of the model file in the version directory; NOT_FOUND when it is missing."""
    filename = spec.config.get("default_model_filename") or default_name
    if os.sep in filename or filename in ("", ".", ".."):
        raise InferdError(ErrorCode.INVALID_ARG, "invalid default_model_filename '%s'" % filename)
    path = os.path.join(spec.model_dir, spec.version, filename)
    if not os.path.exists(path):
        raise InferdError(ErrorCode.NOT_FOUND, "unable to find '%s' for model '%s'" % (path, spec.model_name))
    return path


def parameter(config: dict[str, Any], key: str, default: str = "") -> str:
    value = (config.get("parameters") or {}).get(key)
    if isinstance(value, dict):
        return str(value.get("string_value", default))
    return default if value is None else str(value)


def int_parameter(config: dict[str, Any], key: str, default: int = 0) -> int:
    text = parameter(config, key, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise InferdError(ErrorCode.INVALID_ARG, "parameter '%s' must be an integer, got '%s'" % (key, text)) from None


def gpu_accelerators(config: dict[str, Any]) -> list[dict[str, Any]]:
    accel = ((config.get("optimization") or {}).get("execution_accelerators") or {})
    return [a for a in accel.get("gpu_execution_accelerator") or [] if isinstance(a, dict)]


def config_datatype(config_type: str) -> dtypes.DataType:
    dt = dtypes.BY_CONFIG_NAME.get(config_type)
    if dt is None:
        raise InferdError(ErrorCode.INVALID_ARG, "unsupported data_type '%s'" % config_type)
    return dt


def output_tensor(name: str, array: Any) -> Tensor:
    if type(array) is not np.ndarray and hasattr(array, "ptr"):  # a device.DeviceArray (a GPU instance's output)
        return Tensor(name, array.datatype, array)
    dt = dtypes.from_numpy(array.dtype)
    if dt is None:
        raise InferdError(ErrorCode.INTERNAL, "output '%s' has unsupported dtype %s" % (name, array.dtype))
    if dt.name == "BYTES" and array.dtype.kind == "U":
        array = np.array([s.encode("utf-8") for s in array.reshape(-1)], dtype=object).reshape(array.shape)
    elif dt.name == "BYTES" and array.dtype.kind == "O":
        array = np.array([s.encode("utf-8") if isinstance(s, str) else s for s in array.reshape(-1)],
                         dtype=object).reshape(array.shape)
    return Tensor(name, dt.name, array)


def batch_requests(requests: list[Request], batching: bool,
                   concat: Any = None) -> Optional[tuple[dict[str, Any], list[int]]]:
    """({input: concatenated array}, [batch size of each request]) when the requests can run as one
    batch (batching model, same input names, same shapes beyond dim 0); None otherwise. Device inputs
    are concatenated only by a `concat` that takes them (torch.cat); numpy's cannot."""
    if len(requests) == 1:
        first = requests[0]
        one = int(first.inputs[0].array.shape[0]) if batching and first.inputs and first.inputs[0].array.ndim else 1
        return {t.name: t.array for t in first.inputs}, [one]
    if not batching:
        return None
    names = [t.name for t in requests[0].inputs]
    shapes = {t.name: t.array.shape[1:] for t in requests[0].inputs}
    sizes: list[int] = []
    for request in requests:
        if [t.name for t in request.inputs] != names:
            return None
        size = -1
        for t in request.inputs:
            if t.array.ndim == 0 or t.array.shape[1:] != shapes[t.name]:
                return None
            if size not in (-1, t.array.shape[0]):
                return None
            size = int(t.array.shape[0])
        sizes.append(max(size, 0))
    if concat is None:
        if any(type(t.array) is not np.ndarray for r in requests for t in r.inputs):
            return None  # device inputs: one run per request
        concat = np.concatenate
    merged = {name: concat([r.inputs[i].array for r in requests]) for i, name in enumerate(names)}
    return merged, sizes


def split_batch(requests: list[Request], outputs: list[tuple[str, Any]], sizes: list[int],
                all_outputs: list[str]) -> list[Response]:
    """One Response per request: its rows of every output it asked for (all outputs by default)."""
    if len(requests) == 1:
        return [_response(requests[0], outputs, all_outputs)]
    total = sum(sizes)
    for name, array in outputs:
        if array.ndim == 0 or array.shape[0] != total:
            raise InferdError(ErrorCode.INTERNAL, "output '%s' has %s rows for a batch of %d"
                              % (name, array.shape[0] if array.ndim else "no", total))
    responses = []
    start = 0
    for request, size in zip(requests, sizes):
        part = [(name, array[start:start + size]) for name, array in outputs]
        responses.append(_response(request, part, all_outputs))
        start += size
    return responses


def _response(request: Request, outputs: list[tuple[str, Any]], all_outputs: list[str]) -> Response:
    wanted = request.requested_outputs or all_outputs
    return Response([output_tensor(name, array) for name, array in outputs if name in wanted])


def wanted_outputs(requests: list[Request], all_outputs: list[str]) -> list[str]:
    """Outputs to compute for a batch: the union of what its requests ask for, in config order."""
    asked: set[str] = set()
    for request in requests:
        if not request.requested_outputs:
            return list(all_outputs)
        asked.update(request.requested_outputs)
    return [name for name in all_outputs if name in asked] + sorted(asked - set(all_outputs))
