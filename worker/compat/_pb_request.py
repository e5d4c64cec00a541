"""pb_utils.InferenceRequest: the request `execute` sees (built by the worker, a batch at a time) and
the one a model builds for BLS (`exec`, `async_exec`); its response sender (`get_response_sender()`),
PreferredMemory, InferenceTrace and get_input_tensor_by_name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Optional

from .. import pb_args as _args
from ._pb_base import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    TritonError,
    TritonModelException,
    _state,
)
from ._pb_bls import _bls, _ResponseIterator, _to_response, _wait_s
from ._pb_response import InferenceResponse, _parameters_json, _tensors
from ._pb_tensor import Tensor

_sender_lock = threading.Lock()


class InferenceTrace:
    """A request's trace context: `request.trace().get_context()`, or passed to a BLS request."""

    def __init__(self, context: Optional[str] = None) -> None:
        self._context = context

    def get_context(self) -> Optional[str]:
        return self._context


class MemoryType:
    """`pb_utils.MemoryType`, the enum of PreferredMemory's memory types (also module constants)."""

    TRITONSERVER_MEMORY_CPU = TRITONSERVER_MEMORY_CPU
    TRITONSERVER_MEMORY_GPU = TRITONSERVER_MEMORY_GPU


class PreferredMemory:
    """Accepted and kept, not honoured: a BLS output comes back in device memory when its producer left it
    there and this worker can open device memory, else in host memory (docs/python-backend.md)."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


_REQUEST_SIGNATURE = (
    "triton_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
    "inputs: List[Tensor], requested_output_names: List[str], model_name: str, model_version: int = -1, "
    "flags: int = 0, timeout: int = 0, preferred_memory: PreferredMemory = PreferredMemory(), "
    "trace: InferenceTrace = InferenceTrace(), parameters: object = None)")


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

