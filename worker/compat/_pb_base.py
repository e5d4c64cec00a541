"""pb_utils' foundation: Triton's constants, the two error types, and what the worker sets before it
imports model.py (`_configure`, read by get_model_dir, Logger and BLS). Re-exported by
triton_python_backend_utils.py, the module models import."""

from __future__ import annotations

from typing import Any

from .. import log_levels as _log_levels
from .. import log_lines as _log_lines
from .. import metric_registry as _custom
from .. import pb_args as _args

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 1

# Set by the worker (see _configure); read by get_model_dir(), Logger and InferenceRequest's BLS calls.
_state: dict[str, Any] = {"model_dir": "", "log_verbose": 0, "instance": "", "stream": None,
                          "bls_allowed": False}  # True between initialize and finalize (as Triton's stub)


def _configure(model_dir: str = "", log_verbose: int = 0, instance: str = "", stream: Any = None,
               model: str = "", version: str = "") -> None:
    """Called by the worker before importing model.py."""
    _state.update(model_dir=model_dir, log_verbose=int(log_verbose), instance=instance, stream=stream)
    _log_levels.set_verbose(int(log_verbose))
    _log_lines.configure(model=model, instance=instance, version=version)
    _custom.REGISTRY.instance = instance
    _custom.REGISTRY.source = ("model '%s' instance '%s'" % (model, instance)) if model else "instance '%s'" % instance


def get_model_dir() -> str:
    """Directory holding model.py (`<model_repository>/<model>/<version>`), as in Triton."""
    return str(_state["model_dir"])


# ---- errors ------------------------------------------------------------------------------------


class TritonModelException(Exception):
    """Raise from initialize/execute/finalize; also raised by failing pb_utils helpers."""


class TritonError(Exception):
    """An error attached to an InferenceResponse; codes are TRITONSERVER_Error_Code values."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = 1) -> None:
        # bytes as Triton's std::string reads them; anything else as text (more than Triton takes)
        message = _args.text(message, "message") if isinstance(message, (bytes, bytearray)) else str(message)
        super().__init__(message)
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return "TritonError(%r, code=%d)" % (self._message, self._code)


def _not_supported(what: str) -> TritonModelException:
    return TritonModelException("%s is not supported yet by inferd" % what)

