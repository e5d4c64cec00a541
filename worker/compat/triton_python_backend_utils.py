"""`triton_python_backend_utils` for inferd workers: the public surface Triton's Python backend gives
`model.py` (imported there as `import triton_python_backend_utils as pb_utils`).

The supervisor puts this file on the worker's path under its Triton name; the worker imports it by
that same name, so model code and the worker share one module object (one `InferenceResponse`
class). Plain and decoupled models, BLS (`exec`/`async_exec`, decoupled iterators), model control from
Python (load_model, unload_model, is_model_ready) and custom metrics (MetricFamily, on the server's
/metrics) are supported; what is not (docs/python-backend.md) raises "... is not supported yet by inferd".

Runs on Python 3.9+ with numpy only (+ inferd.worker.wire).
"""

from __future__ import annotations

import enum
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
from inferd.worker import custom_metrics as _custom
from inferd.worker import device as _device
from inferd.worker import log_levels as _log_levels
from inferd.worker import log_lines as _log_lines
from inferd.worker import pb_args as _args
from inferd.worker.wire import bytes_codec, dtypes

# ---- constants ---------------------------------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 1

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_NUMBER_TO_NUMPY = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}

# Set by the worker (see _configure); read by get_model_dir() and Logger.
_state: dict[str, Any] = {"model_dir": "", "log_verbose": 0, "instance": "", "stream": None,
                          "bls_allowed": False}  # True between initialize and finalize (as Triton's stub)
_log_lock = threading.Lock()
_sender_lock = threading.Lock()


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


# ---- tensors -----------------------------------------------------------------------------------

_BF16_STORAGE = np.dtype("<u2")


def _datatype_of(array: np.ndarray) -> str:
    dt = dtypes.from_numpy(array.dtype)  # BF16 for ml_dtypes' bfloat16
    if dt is None:
        raise TritonModelException("Unsupported numpy dtype %s for a Triton tensor" % array.dtype)
    return dt.name


# numeric dtype -> protocol name, filled as models build their outputs (one dict look-up per Tensor);
# BYTES arrays (kinds O, S, U) are left to _datatype_of: their dtypes vary with the length of the items
_NUMERIC_DATATYPE: dict[np.dtype, str] = {}
_numeric_datatype = _NUMERIC_DATATYPE.get
_ndarray = np.ndarray


_DL_UINT = 1  # DLDataTypeCode kDLUInt
_DL_BFLOAT = 4  # kDLBfloat
_DLTENSOR_DTYPE_OFFSET = 20  # DLTensor: data(8) device(8) ndim(4) -> dtype {code u8, bits u8, lanes u16}


def _relabel_capsule(capsule: Any, from_code: int, to_code: int) -> bool:
    """Change the dtype code of an unconsumed 16-bit legacy DLPack capsule ("dltensor") in place:
    numpy has no bfloat16, so BF16 travels as uint16 through numpy and is relabelled at the edge.
    Returns True if the capsule had `from_code` (and was relabelled)."""
    import ctypes

    address = _device.dltensor_address(capsule)
    if not address:
        return False
    code = ctypes.c_uint8.from_address(address + _DLTENSOR_DTYPE_OFFSET)
    bits = ctypes.c_uint8.from_address(address + _DLTENSOR_DTYPE_OFFSET + 1)
    if code.value != from_code or bits.value != 16:
        return False
    code.value = to_code
    return True


class _DLPackCapsule:
    """Gives a bare DLPack capsule the `__dlpack__` protocol numpy's from_dlpack expects."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple:
        return (1, 0)


_TENSOR_SIGNATURE = "triton_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"


class Tensor:
    """`Tensor(name, numpy_array)`: a named tensor in host memory, or (from `from_dlpack` with a CUDA
    tensor, or an input that a GPU produced when FORCE_CPU_ONLY_INPUT_TENSORS is "no") in device
    memory, held as a `DeviceArray` and never copied to the host by pb_utils."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name: str, numpy_array: Any) -> None:
        if type(numpy_array) is _ndarray and type(name) is str:  # what models pass: the checks below, in short
            datatype = _numeric_datatype(numpy_array.dtype)
            if datatype is not None:
                self._name = name
                self._array = numpy_array
                self._datatype = datatype
                return
        if not isinstance(name, (str, bytes, bytearray)) or not isinstance(numpy_array, np.ndarray):
            # python_backend's binding takes (str, numpy.ndarray) only: None, lists, scalars and device
            # tensors are a TypeError there (a GPU tensor goes through Tensor.from_dlpack)
            error = _args.incompatible("__init__", _TENSOR_SIGNATURE, (name, numpy_array))
            if _device.is_device_object(numpy_array):
                error.args = (error.args[0] + "\n(use Tensor.from_dlpack for a GPU tensor)",)
            raise error
        name = _args.text(name, "Tensor name")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array
        datatype = _datatype_of(array)
        if datatype == "BF16":
            array = array.view(_BF16_STORAGE)
        elif array.dtype.kind not in "OSU" and len(_NUMERIC_DATATYPE) < 64:
            _NUMERIC_DATATYPE[array.dtype] = datatype
        self._name = name
        self._array = array
        self._datatype = datatype

    @classmethod
    def _wrap(cls, name: str, array: Any, datatype: str) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    @classmethod
    def _wrap_inputs(cls, tensors: list[Any]) -> list[Tensor]:
        """`_wrap` of each of a worker request's input tensors (backends.base.Tensor), in one call."""
        wrapped = []
        new = cls.__new__
        for t in tensors:
            tensor = new(cls)
            tensor._name = t.name
            tensor._array = t.array
            tensor._datatype = t.datatype
            wrapped.append(tensor)
        return wrapped

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if type(self._array) is _device.DeviceArray:
            raise TritonModelException(
                "Tensor '%s' is stored in GPU and cannot be converted to NumPy: use to_dlpack()" % self._name)
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor '%s' has datatype BF16, which numpy cannot represent: use to_dlpack()" % self._name
            )
        return self._array

    def shape(self) -> list[int]:
        return [int(s) for s in self._array.shape]

    def triton_dtype(self) -> int:
        return dtypes.BY_NAME[self._datatype].config_number

    def is_cpu(self) -> bool:
        return type(self._array) is not _device.DeviceArray

    def memory_type(self) -> int:
        return TRITONSERVER_MEMORY_CPU if self.is_cpu() else TRITONSERVER_MEMORY_GPU

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not support BYTES tensors ('%s')" % self._name)
        array: Any = self._array
        if type(array) is _device.DeviceArray:
            try:
                return array.to_dlpack()
            except (_device.DeviceTensorError, ImportError) as exc:
                raise TritonModelException("Tensor '%s': %s" % (self._name, exc)) from None
        if not array.flags.writeable:
            # numpy refuses to export read-only views (inputs are shared, zero-copy): hand out a copy
            array = array.copy()
        capsule = array.__dlpack__()
        if self._datatype == "BF16":  # numpy exports uint16: relabel the capsule as bfloat16
            _relabel_capsule(capsule, _DL_UINT, _DL_BFLOAT)
        return capsule

    def __dlpack_device__(self) -> tuple:
        if type(self._array) is _device.DeviceArray:
            return (_device.KDL_CUDA, self._array.device)
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with `__dlpack__` (C-contiguous). A CUDA tensor
        (torch, cupy, any CUDA DLPack producer) stays on its device, shared, not copied; bfloat16
        tensors (e.g. torch.bfloat16) become BF16 tensors."""
        name = _args.text(name, "Tensor name")
        obj = dlpack_tensor
        if isinstance(obj, Tensor):
            return Tensor._wrap(name, obj._array, obj._datatype)
        if isinstance(obj, np.ndarray):
            return Tensor(name, obj)
        if _device.is_device_object(obj):
            try:
                array = _device.from_object(obj, name)
            except _device.DeviceTensorError as exc:
                raise TritonModelException(str(exc)) from None
            return Tensor._wrap(name, array, array.datatype)
        if hasattr(obj, "__dlpack__"):
            if hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] not in (1, 3):
                raise _not_supported("Tensor.from_dlpack on a tensor of DLPack device type %d"
                                     % obj.__dlpack_device__()[0])
            capsule = obj.__dlpack__()
        else:
            capsule = obj
        device = _device.capsule_device(capsule)
        if device is not None and device[0] not in (1, 3):
            raise _not_supported("Tensor.from_dlpack on a tensor of DLPack device type %d" % device[0])
        bf16 = _relabel_capsule(capsule, _DL_BFLOAT, _DL_UINT)
        from_dlpack = getattr(np, "from_dlpack", None) or vars(np).get("_from_dlpack")
        if from_dlpack is None:
            raise _not_supported("Tensor.from_dlpack with numpy %s" % np.__version__)
        try:
            array = from_dlpack(_DLPackCapsule(capsule))
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TritonModelException("cannot import DLPack tensor '%s': %s" % (name, exc)) from None
        if not array.flags.c_contiguous:
            raise TritonModelException("DLPack tensor '%s' must be C-contiguous" % name)
        if bf16:
            return Tensor._wrap(name, array.view(_BF16_STORAGE), "BF16")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return "Tensor(%r, %s, shape=%s)" % (self._name, self._datatype, self.shape())


# ---- requests / responses ----------------------------------------------------------------------


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


class InferenceTrace:
    def __init__(self, context: Optional[str] = None) -> None:
        self._context = context

    def get_context(self) -> Optional[str]:
        return self._context


class MemoryType:
    """`pb_utils.MemoryType`, the enum of PreferredMemory's memory types (also module constants)."""

    TRITONSERVER_MEMORY_CPU = TRITONSERVER_MEMORY_CPU
    TRITONSERVER_MEMORY_GPU = TRITONSERVER_MEMORY_GPU


class PreferredMemory:
    """Accepted and kept; BLS outputs always come back in host memory."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


_RESPONSE_SIGNATURE = ("triton_python_backend_utils.InferenceResponse(output_tensors: List[Tensor] = [], "
                       "error: TritonError = None, parameters: object = None)")
_REQUEST_SIGNATURE = (
    "triton_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
    "inputs: List[Tensor], requested_output_names: List[str], model_name: str, model_version: int = -1, "
    "flags: int = 0, timeout: int = 0, preferred_memory: PreferredMemory = PreferredMemory(), "
    "trace: InferenceTrace = InferenceTrace(), parameters: object = None)")


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


class InferenceResponseSender:
    """`request.get_response_sender()`. Decoupled models: each `send` goes to the client at once,
    from any thread, until the FINAL flag closes the sender. Non-decoupled models: exactly one
    response (then FINAL), collected and returned as the request's response."""

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request
        self.responses: list[InferenceResponse] = []
        self.closed = False
        self.done = threading.Event()  # set once closed: a non-decoupled request waits for it
        self._lock = threading.Lock()  # one send at a time per request: responses keep their order

    def send(self, response: Optional[InferenceResponse] = None, flags: int = 0) -> None:
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError("send() expects a pb_utils.InferenceResponse, found %s" % type(response))
        stream = self._request._stream
        with self._lock:
            if stream is None:
                self._check_non_decoupled(response, final)
            if self.closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
                raise TritonModelException("Unable to send response. Unsupported flag provided.")
            if flags == 0 and response is None:
                raise TritonModelException(
                    "Inference Response object must be provided when the response flags is set to zero."
                )
            if stream is not None:
                stream(response, final)
            elif response is not None:
                self.responses.append(response)
            if final:
                self.closed = True
                self.done.set()

    def _check_non_decoupled(self, response: Optional[InferenceResponse], final: bool) -> None:
        if response is not None and self.responses:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send more than one response."
            )
        if response is None and final and not self.responses:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send complete final before "
                "sending a response."
            )

    def _close(self) -> bool:
        """Close the sender (the request has ended elsewhere); True when it was still open."""
        with self._lock:
            was_open = not self.closed
            self.closed = True
            self.done.set()
            return was_open

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()


class InferenceRequest:
    """A request as `execute` sees it; also constructible by a model for BLS (`exec`, `async_exec`)."""

    _preferred_memory: Optional[PreferredMemory] = None  # (kept, never read: a worker's requests leave it unset)
    # what a worker's request holds unless told otherwise (`_batch_from_worker` leaves them to the class)
    _trace: Optional[InferenceTrace] = None
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
    _sender: Optional[InferenceResponseSender] = None
    _stream: Optional[Callable[[Optional[InferenceResponse], bool], None]] = None
    _cancel_probe: Optional[Callable[[], bool]] = None
    _cancelled_of: Any = None  # a worker request (backends.base.Request) asked instead of _cancel_probe

    def __init__(
        self,
        request_id: str = "",
        correlation_id: Any = 0,
        inputs: list[Tensor] = _args.REQUIRED,
        requested_output_names: list[str] = _args.REQUIRED,
        model_name: str = _args.REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Optional[PreferredMemory] = None,
        trace: Optional[InferenceTrace] = None,
        parameters: Any = None,
    ) -> None:
        # every argument taken as python_backend's bindings take it (inferd/worker/pb_args.py): inputs,
        # requested_output_names and model_name are required, and only `parameters` may be None
        given = (request_id, correlation_id, inputs, requested_output_names, model_name, model_version, flags,
                 timeout)
        if any(value is None or value is _args.REQUIRED for value in given):
            raise _args.incompatible("__init__", _REQUEST_SIGNATURE, kwargs={
                "request_id": request_id, "correlation_id": correlation_id, "inputs": inputs,
                "requested_output_names": requested_output_names, "model_name": model_name,
                "model_version": model_version, "flags": flags, "timeout": timeout})
        self._request_id = _args.text(request_id, "request_id")
        self._correlation_id = _args.correlation_id(correlation_id)
        if self._correlation_id is None:
            raise TritonModelException("Correlation ID must be integer or string")
        self._model_name = _args.text(model_name, "model_name")
        self._inputs = _tensors(inputs, "inputs", "Input tensor for request with id '%s' and model name '%s' "
                                "should not be empty." % (self._request_id, self._model_name))
        self._requested = _args.texts(requested_output_names, "requested_output_names")
        if "" in self._requested:
            raise TritonModelException("Requested output name for request with id '%s' and model name '%s' "
                                       "should not be empty." % (self._request_id, self._model_name))
        self._model_version = _args.integer(model_version, "model_version")
        self._flags = _args.integer(flags, "flags", _args.UINT32)
        self._timeout = _args.integer(timeout, "timeout", _args.UINT64)
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._trace = trace or InferenceTrace()
        self._parameters = _parameters_json(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._cancel_probe = None
        self._sender = None
        self._stream = None

    @classmethod
    def _from_worker(
        cls, request_id: str, correlation_id: Any, inputs: list[Tensor], requested: list[str],
        model_name: str, model_version: int, flags: int, timeout: int, parameters: str,
        cancel_probe: Optional[Callable[[], bool]], trace: str = "",
    ) -> InferenceRequest:
        req = cls.__new__(cls)
        req._request_id = request_id
        req._correlation_id = correlation_id
        req._inputs = inputs
        req._requested = requested
        req._model_name = model_name
        req._model_version = model_version
        req._flags = flags
        req._timeout = timeout
        req._trace = InferenceTrace(trace) if trace else None  # type: ignore[assignment]
        req._parameters = parameters
        req._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        req._cancel_probe = cancel_probe
        req._sender = None
        req._stream = None  # set by the worker for decoupled models: where send() delivers
        return req

    @classmethod
    def _batch_from_worker(cls, requests: list[Any], output_names: list[str], model_name: str,
                           model_version: int, plain: bool = False) -> list[InferenceRequest]:
        """`_from_worker` of each of a batch's worker requests (backends.base.Request), their inputs
        wrapped as by `Tensor._wrap_inputs`: one call per batch, not two per request. A batch's requests
        usually share one list of wanted outputs: they then share its copy too (never changed: the
        accessor hands out copies). Trace, release flags, sender and stream are left at the class's
        defaults (None, RELEASE_ALL, None, None) unless the request has a trace. `plain`: every request's
        correlation id, flags, timeout, parameters and trace are at their defaults (backends.base.PlainRequests),
        which are then written without reading them."""
        new = object.__new__
        tensor_cls = Tensor
        out: list[InferenceRequest] = []
        copied_from: Any = out  # the list of wanted outputs last copied (not yet any)
        requested: list[str] = []
        for r in requests:  # loops, not comprehensions: no function call per request
            inputs = r.inputs
            if len(inputs) == 1:  # what most models take
                t = inputs[0]
                tensor = new(tensor_cls)
                tensor._name = t.name
                tensor._array = t.array
                tensor._datatype = t.datatype
                wrapped = [tensor]
            else:
                wrapped = tensor_cls._wrap_inputs(inputs)
            wanted = r.requested_outputs
            if wanted is not copied_from:
                copied_from = wanted
                requested = list(wanted or output_names)
            req = new(cls)
            req._request_id = r.id
            req._inputs = wrapped
            req._requested = requested
            req._model_name = model_name
            req._model_version = model_version
            req._cancelled_of = r  # (its bound is_cancelled made only if asked: see is_cancelled)
            if plain:  # (the same attributes in the same order either way: Python shares their keys)
                req._correlation_id = 0
                req._flags = 0
                req._timeout = 0
                req._parameters = "{}"
            else:
                req._correlation_id = r.correlation_id
                req._flags = r.flags
                req._timeout = r.timeout_us
                req._parameters = r.parameters
                trace = r.trace
                if trace:
                    req._trace = InferenceTrace(trace)
            out.append(req)
        return out

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> Any:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = _args.integer(flags, "flags", _args.UINT32)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def trace(self) -> InferenceTrace:
        return self._trace or InferenceTrace()

    def model_name(self) -> str:
        return self._model_name

    def requested_output_names(self) -> list[str]:
        return list(self._requested)  # a new list each call, as Triton's binding gives

    def is_cancelled(self) -> bool:
        probe = self._cancel_probe
        if probe is None:
            of = self._cancelled_of
            return bool(of is not None and of.is_cancelled())
        return bool(probe())

    def set_release_flags(self, flags: int) -> None:
        """RESCHEDULE: run this request again (iterative_sequence models; worker/backends/python_reschedule.py)."""
        self._release_flags = _args.integer(flags, "flags", _args.UINT32)

    def release_flags(self) -> int:
        return self._release_flags

    def get_response_sender(self) -> InferenceResponseSender:
        sender = self._sender
        if sender is None:
            with _sender_lock:  # threads of a decoupled model may ask at the same time
                sender = self._sender
                if sender is None:
                    sender = self._sender = InferenceResponseSender(self)
        return sender

    # ---- BLS: this request sent to another model through the supervisor ----

    def _send_bls(self, decoupled: bool, direct: bool = False) -> Any:
        if not _state["bls_allowed"]:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        if not self._model_name:
            raise TritonModelException("BLS request must specify 'model_name'")
        inputs = [(tensor._name, tensor._datatype, tensor._array) for tensor in self._inputs]
        version = "" if self._model_version < 0 else str(self._model_version)
        trace = (self._trace.get_context() or "") if self._trace is not None else ""
        return _bls().infer(self._model_name, version, self._request_id, inputs, self._requested,
                            self._correlation_id, self._flags, int(self._timeout or 0), self._parameters, decoupled,
                            direct, str(trace))

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on `model_name` and wait: an InferenceResponse (errors inside it, as
        Triton), or with decoupled=True an iterator of them ending after the final one."""
        client = _bls()
        if decoupled:
            call_id, call = self._send_bls(True)
            return _ResponseIterator(client, call_id, call, self._timeout)
        call_id, _ = self._send_bls(False, direct=True)  # this thread sends and reads the reply itself
        from inferd.worker.wire.errors import InferdError

        try:
            return _to_response(client.wait_direct(call_id, _wait_s(self._timeout)))
        except InferdError as exc:
            return InferenceResponse(error=TritonError(exc.message, TritonError.UNAVAILABLE))

    async def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` for `async def execute`: awaits the response without blocking the event loop."""
        import asyncio

        client = _bls()
        call_id, call = self._send_bls(decoupled)
        if decoupled:  # the first response is awaited here, off the loop: a plain `for` then rarely blocks it
            iterator = _ResponseIterator(client, call_id, call, self._timeout)
            await asyncio.get_running_loop().run_in_executor(None, iterator._first)
            return iterator
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(call.future), _wait_s(self._timeout))
        except asyncio.TimeoutError:
            client.cancel(call_id)
            client.forget(call_id)
            return InferenceResponse(error=TritonError("Request timeout expired", TritonError.UNAVAILABLE))
        return _to_response(reply)


class _ResponseIterator:
    """`exec(decoupled=True)`: responses as they arrive; the last one is final (possibly empty, as
    Triton's). Dropping the iterator early cancels the request. As python_backend's, it keeps what it
    received: once the final response came, iterating it again yields every response again."""

    def __init__(self, client: Any, call_id: int, call: Any, timeout_us: int) -> None:
        self._client = client
        self._call_id = call_id
        self._replies = client.stream(call, _wait_s(timeout_us))
        self._finished = False
        self._responses: list[InferenceResponse] = []
        self._next = 0  # index in _responses of the next one to yield

    def __iter__(self) -> _ResponseIterator:
        if self._finished and self._next >= len(self._responses):
            self._next = 0
        return self

    def cancel(self) -> None:
        """Cancel the call (python_backend after 2.51): the callee sees `is_cancelled()`, and the stream
        ends with a final cancellation error."""
        if not self._finished:
            self._client.cancel(self._call_id)

    def __next__(self) -> InferenceResponse:
        if self._next < len(self._responses):
            self._next += 1
            return self._responses[self._next - 1]
        if self._finished or not self._receive():
            raise StopIteration
        self._next += 1
        return self._responses[-1]

    def _receive(self) -> bool:
        """Wait for the next response and keep it; False: the stream had ended."""
        try:
            reply = next(self._replies)
        except StopIteration:
            self._finished = True
            return False
        except TritonModelException:
            self._finished = True
            raise
        except Exception as exc:  # the deadline passed
            self._finished = True
            self._client.cancel(self._call_id)
            self._client.forget(self._call_id)
            self._responses.append(
                InferenceResponse(error=TritonError(str(getattr(exc, "message", exc)), TritonError.UNAVAILABLE)))
            return True
        if reply.final:
            self._finished = True
        self._responses.append(_to_response(reply))
        return True

    def _first(self) -> None:
        """Wait for the first response (async_exec runs this off the event loop, as python_backend)."""
        if not self._responses and not self._finished:
            self._receive()

    def __del__(self) -> None:
        if not self._finished:
            try:
                self._client.cancel(self._call_id)
                self._client.forget(self._call_id)
            except Exception:  # noqa: S110 - the worker may be exiting
                pass


def _bls() -> Any:
    from inferd.worker import bls
    from inferd.worker.wire.errors import InferdError

    try:
        return bls.client()
    except InferdError as exc:
        raise TritonModelException(exc.message) from None




def _wait_s(timeout_us: Any) -> Optional[float]:
    """How long the model waits for a reply: the supervisor enforces the request's timeout itself,
    so this is only a backstop (a lost reply) well beyond it."""
    timeout = int(timeout_us or 0)
    return None if timeout <= 0 else timeout / 1e6 + 5.0


def _to_response(reply: Any) -> InferenceResponse:
    error = None
    if reply.error is not None:
        error = TritonError(reply.error.message, int(reply.error.code))
    outputs = [Tensor._wrap(name, array, datatype) for name, datatype, array in reply.outputs]
    return InferenceResponse(outputs, error, reply.parameters or None)


# ---- model control from Python ------------------------------------------------------------------


def _control(op: str, model_name: str, **kwargs: Any) -> Any:
    result = _bls().control(op, model_name, **kwargs)
    if result.error is not None:
        raise TritonModelException(result.error.message)
    return result


def load_model(model_name: str, config: str = "", files: Optional[dict[str, bytes]] = None) -> None:
    """Load (or reload) a model; the server must run with --model-control-mode explicit."""
    _control("load", _args.text(model_name, "model_name"), config=_args.text(config or "", "config"),
             files=dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _control("unload", _args.text(model_name, "model_name"), unload_dependents=bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    version = model_version if isinstance(model_version, (str, bytes)) else str(_args.integer(model_version,
                                                                                                  "model_version"))
    return bool(_control("ready", _args.text(model_name, "model_name"),
                         model_version=_args.text(version, "model_version")).ready)


# ---- logging -----------------------------------------------------------------------------------


class LogLevel(enum.IntEnum):
    """`pb_utils.Logger.LogLevel`: Logger.log takes one of these, never a plain int (as python_backend)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


def _log_message(message: Any, function: str, signature: str, args: tuple) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, (bytes, bytearray)):  # Triton's std::string: the text, not b'...'
        return bytes(message).decode("utf-8", "replace")
    raise _args.incompatible(function, signature, args)


_LOG_SIGNATURE = "(message: str, level: triton_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"


class Logger:
    """Triton-style log lines on stderr (which the supervisor gathers into the server log)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LETTER = {0: "I", 1: "W", 2: "E", 3: "I"}

    @staticmethod
    def log(message: Any, level: Any = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):
            raise _args.incompatible("log", _LOG_SIGNATURE, (message, level))
        Logger._emit(_log_message(message, "log", _LOG_SIGNATURE, (message, level)), level, 2)

    @staticmethod
    def log_info(message: Any) -> None:
        Logger._emit(_log_message(message, "log_info", "(message: str) -> None", (message,)), Logger.INFO, 2)

    @staticmethod
    def log_warn(message: Any) -> None:
        Logger._emit(_log_message(message, "log_warn", "(message: str) -> None", (message,)), Logger.WARNING, 2)

    @staticmethod
    def log_error(message: Any) -> None:
        Logger._emit(_log_message(message, "log_error", "(message: str) -> None", (message,)), Logger.ERROR, 2)

    @staticmethod
    def log_verbose(message: Any) -> None:
        Logger._emit(_log_message(message, "log_verbose", "(message: str) -> None", (message,)),
                     Logger.VERBOSE, 2)

    @staticmethod
    def _emit(message: Any, level: int, depth: int) -> None:
        level = int(level)
        if isinstance(message, (bytes, bytearray)):  # Triton's std::string: the text, not b'...'
            message = bytes(message).decode("utf-8", "replace")
        if not _log_levels.enabled(level):  # the server's settings, also as changed at run time
            return
        try:
            frame = sys._getframe(depth)
            where = "%s:%d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
        except ValueError:
            where = "?"
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + ".%06d" % int((now % 1) * 1e6)
        line = "%s%s %d %s] %s\n" % (Logger._LETTER.get(level, "I"), stamp, os.getpid(), where, message)
        if _log_lines.is_json():
            line = _log_lines.json_line(Logger._LETTER.get(level, "I"), where, str(message))
        stream = _state["stream"] or sys.stderr
        with _log_lock:
            try:
                stream.write(line)
                stream.flush()
            except (OSError, ValueError):
                pass


# ---- custom metrics (exported on the server's /metrics; worker/custom_metrics.py) ---------------


class Metric:
    """One metric of a family (one label set); made by `MetricFamily.Metric(labels, buckets)`."""

    def __init__(self, state: _custom.MetricState) -> None:
        self._state = state

    def increment(self, value: float) -> None:
        try:
            _custom.REGISTRY.increment(self._state, value)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()

    def set(self, value: float) -> None:
        try:
            _custom.REGISTRY.set(self._state, value)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()

    def observe(self, value: float) -> None:
        try:
            _custom.REGISTRY.observe(self._state, value)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()

    def value(self) -> float:
        """This instance's own value (in Triton, the value summed over every instance sharing the metric)."""
        try:
            return _custom.REGISTRY.value(self._state)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None


class MetricFamily:
    """A custom metric family, exported on the server's /metrics under `name` while this object lives."""

    COUNTER = _custom.rules.COUNTER
    GAUGE = _custom.rules.GAUGE
    HISTOGRAM = _custom.rules.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        # bytes as Triton's std::string reads them; other types are refused below, naming the argument
        if isinstance(name, (bytes, bytearray)):
            name = _args.text(name, "name")
        if isinstance(description, (bytes, bytearray)):
            description = _args.text(description, "description")
        if type(kind) is not int or kind not in _custom.rules.KIND_NAMES:
            raise TypeError("MetricFamily(): kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM, not %r"
                            % (kind,))
        try:
            self._state = _custom.REGISTRY.add_family(name, description, kind)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        self.name = name
        self.description = description
        self.kind = kind
        weakref.finalize(self, _custom.REGISTRY.drop_family, self._state.fid)
        _custom.REGISTRY.applied()

    def Metric(  # noqa: N802 - Triton's method name
        self, labels: Optional[dict[str, str]] = None, buckets: Optional[list[float]] = None
    ) -> Metric:
        try:
            metric = Metric(_custom.REGISTRY.add_metric(self._state, labels, buckets))
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()
        return metric


# ---- pure-Python helpers (same names and behaviour as Triton's module) --------------------------


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Length-prefixed serialization of an object/bytes array (C order); `()` for an empty array,
    None for other dtypes (as Triton's helper)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        return bytes_codec.serialize(input_tensor)
    return None


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """1-D object array of `bytes` from a length-prefixed buffer."""
    if isinstance(encoded_tensor, np.ndarray) and encoded_tensor.dtype == np.object_:
        encoded_tensor = encoded_tensor.reshape(-1)[0] if encoded_tensor.size else b""
    try:
        return bytes_codec.deserialize(encoded_tensor)
    except Exception as exc:
        raise TritonModelException(getattr(exc, "message", str(exc))) from None


def get_input_tensor_by_name(inference_request: Any, name: str) -> Optional[Tensor]:
    if type(inference_request) is InferenceRequest:  # (called per request: its fields, not its accessors)
        for tensor in inference_request._inputs:
            if tensor._name == name:
                return tensor
        return None
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Optional[Tensor]:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> Optional[dict[str, Any]]:
    for entry in model_config.get("input", []):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> Optional[dict[str, Any]]:
    for entry in model_config.get("output", []):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMBER_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> Optional[int]:
    if data_type is np.object_ or data_type is np.bytes_:
        return 13
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in ("O", "S"):
        return 13
    if dt.kind == "U":
        return None
    found = dtypes.from_numpy(dt)
    return found.config_number if found is not None and found.numpy is not None else None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


# ---- ModelConfig (auto_complete_config) ---------------------------------------------------------


class ModelConfig:
    """The model configuration handed to `auto_complete_config`; only max_batch_size, the scheduler,
    inputs, outputs and the transaction policy may be changed."""

    def __init__(self, model_config: Any) -> None:
        config = json.loads(model_config) if isinstance(model_config, (str, bytes)) else dict(model_config)
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                "configuration specified max_batch_size %s, but in auto-complete-config function for "
                "model '%s' specified max_batch_size %s" % (current, self._name(), max_batch_size)
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    "Configuration specified scheduling_choice as '%s', but auto-complete-config function "
                    "for model '%s' tries to set scheduling_choice as 'dynamic_batching'"
                    % (scheduler, self._name())
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple) -> None:
        model = self._name()
        for key in tensor:
            if key not in allowed:
                listed = ", ".join("'%s'" % a for a in allowed[:-1]) + " and '%s'" % allowed[-1]
                raise ValueError(
                    "%s '%s' in auto-complete-config function for model '%s' contains property other "
                    "than %s." % (kind, tensor.get("name"), model, listed)
                )
        if "name" not in tensor:
            raise ValueError(
                "%s in auto-complete-config function for model '%s' is missing 'name' property."
                % (kind, model)
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    "%s '%s' in auto-complete-config function for model '%s' is missing '%s' property."
                    % (kind, tensor["name"], model, key)
                )
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    "unable to load model '%s', configuration expects datatype %s for %s '%s', model "
                    "provides %s" % (model, current_type, kind, tensor["name"], tensor["data_type"])
                )
            if current.get("dims") and current["dims"] != tensor["dims"]:
                raise ValueError(
                    "model '%s', tensor '%s': the model expects dims %s but the model configuration "
                    "specifies dims %s" % (model, tensor["name"], tensor["dims"], current["dims"])
                )
            if (
                kind == "input" and "optional" in current and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    "model '%s', tensor '%s': the model expects optional %s but the model configuration "
                    "specifies optional %s" % (model, tensor["name"], tensor["optional"], current["optional"])
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model '%s' contains "
                    "property other than 'decoupled'." % self._name()
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model '%s', which is "
                    "already set to '%s'." % (self._name(), policy["decoupled"])
                )
            policy["decoupled"] = transaction_policy_dict["decoupled"]
