"""pb_utils.InferenceResponse, with the checks of tensor lists and parameters that requests share,
and get_output_tensor_by_name. (The response sender stands with the request that owns it: _pb_request.py.)"""

from __future__ import annotations

import json
from typing import Any, Optional

from .. import pb_args as _args
from ._pb_base import TritonError, TritonModelException
from ._pb_tensor import Tensor


def _parameters_json(parameters: Any) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters
    if not isinstance(parameters, dict):
        # (the bindings' words: "Expect <dict type>, got <class ...>")
        raise TritonModelException("Expect a dict of parameters, got %s" % type(parameters))
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException("Expect parameters keys to have type str, found type %s" % type(key))
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type %s" % type(value)
            )
        if type(value) is not bool and isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
            # Triton keeps an int parameter as int64 (and refuses the response otherwise); the supervisor's
            # reader would take a longer one for a float (fuzz/targets/wire_codec.py)
            raise TritonModelException("parameter '%s': %d does not fit in int64" % (key, value))
    return json.dumps(parameters)


def _tensors(tensors: Any, what: str, empty: str = "") -> list[Tensor]:
    """A `std::vector<std::shared_ptr<Tensor>>` argument: a list or tuple of pb_utils.Tensor. A None
    entry is a null pointer there, which the constructor refuses with `empty` (TritonModelException)."""
    if isinstance(tensors, (str, bytes, dict)) or not hasattr(tensors, "__iter__"):
        raise TypeError("%s must be a list of pb_utils.Tensor, got %s" % (what, type(tensors).__name__))
    out = list(tensors)
    for tensor in out:
        if tensor is None and empty:
            raise TritonModelException(empty)
        if not isinstance(tensor, Tensor):
            raise TypeError("%s must hold pb_utils.Tensor objects, found %s" % (what, type(tensor).__name__))
    return out


_RESPONSE_SIGNATURE = ("triton_python_backend_utils.InferenceResponse(output_tensors: List[Tensor] = [], "
                       "error: TritonError = None, parameters: object = None)")


class InferenceResponse:
    """`InferenceResponse(output_tensors=[], error=None, parameters=None)`."""

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(
        self, output_tensors: Any = (), error: Optional[TritonError] = None, parameters: Any = None,
    ) -> None:
        if type(output_tensors) is list and error is None and parameters is None:  # the usual response
            for tensor in output_tensors:
                if type(tensor) is not Tensor:
                    break
            else:
                self._outputs = list(output_tensors)
                self._error = None
                self._parameters = "{}"
                return
        if output_tensors is None:  # the binding's default is [], and None is no list
            raise _args.incompatible("__init__", _RESPONSE_SIGNATURE, kwargs={"output_tensors": None})
        outputs = _tensors(output_tensors, "output_tensors",
                           "Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError("error must be a pb_utils.TritonError, found %s" % type(error))
        self._outputs = outputs
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Optional[TritonError]:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def get_output_tensor_by_name(inference_response: Any, name: str) -> Optional[Tensor]:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None

