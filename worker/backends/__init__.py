"""Backend selection by name; each backend module is imported only when a model needs it."""

from __future__ import annotations

import importlib

from ..wire.errors import ErrorCode, InferdError
from .base import Backend

# backend name -> (module relative to this package, class); a module is imported only when a model
# of that backend is loaded, so a Python-model worker never imports onnxruntime, torch or tensorrt.
_REGISTRY: dict[str, tuple[str, str]] = {
    "python": (".python_model", "PythonBackend"),
    "onnxruntime": (".onnxruntime", "OnnxRuntimeBackend"),
    "pytorch": (".pytorch", "PyTorchBackend"),
    "tensorrt": (".tensorrt", "TensorRTBackend"),
    "vllm": (".vllm", "VllmBackend"),
}


def available() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str) -> Backend:
    """A fresh backend object for `name`; UNSUPPORTED if this worker has no such backend."""
    target = _REGISTRY.get(name)
    if target is None:
        raise InferdError(ErrorCode.UNSUPPORTED, "backend '%s' is not supported by this worker" % name)
    module = importlib.import_module(target[0], __name__)
    backend: Backend = getattr(module, target[1])()
    return backend
