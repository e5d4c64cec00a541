"""The backend that runs a bound Python function (one instance = one callable of the model).

The runtime (worker/message_loop.py) hands it a batch of requests; it builds PyTriton `Request` mappings,
calls the function with the list, and turns the returned dicts (one per request) into responses. A
decoupled model's function is a generator: every dict (or list of dicts) it yields goes out at once.
`strict=True` checks each output's dtype and shape against the bound `Tensor`s; otherwise outputs are
converted to the declared dtype where numpy can.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
from inferd.worker.backends.base import ModelSpec, Request, Response, Tensor, WorkerContext
from inferd.worker.wire import dtypes
from inferd.worker.wire.errors import ErrorCode, InferdError

from .exceptions import PyTritonValidationError
from .model_spec import BoundModel
from .proxy import types as proxy

_current = threading.local()  # the model being served on this thread (decorators read its config)


def current_model() -> Optional[BoundModel]:
    return getattr(_current, "model", None)


def _error(exc: BaseException) -> InferdError:
    if isinstance(exc, InferdError):
        return exc
    return InferdError(ErrorCode.INTERNAL, "%s: %s" % (type(exc).__name__, exc))


class FunctionBackend:
    name = "external"
    supports_auto_complete = False
    supports_decoupled = True
    checks_outputs = False  # done here: the strict check, the dtype conversion

    def __init__(self, model: BoundModel, func: Callable[..., Any]) -> None:
        self._model = model
        self._func = func
        self._context: Optional[WorkerContext] = None
        self._decoupled = model.config.decoupled
        self._out_dtypes = model.output_dtypes()
        self._out_shapes = {str(t.name): tuple(int(d) for d in t.shape) for t in model.outputs}
        self._datatypes = {name: (dtypes.from_numpy(dt).name if dtypes.from_numpy(dt) else "BYTES")
                           for name, dt in self._out_dtypes.items()}
        self._batched = model.config.batching

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        return config

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        self._context = context

    def unload(self) -> Optional[InferdError]:
        return None

    # ---- execution ----
    def _requests(self, requests: list[Request]) -> list[proxy.Request]:
        out = []
        for r in requests:
            data = {t.name: t.array for t in r.inputs}
            try:
                params = json.loads(r.parameters) if r.parameters else {}
            except ValueError:
                params = {}
            out.append(proxy.Request(data, params if isinstance(params, dict) else {},
                                     list(r.requested_outputs) or None))
        return out

    def _call(self, requests: list[proxy.Request]) -> Any:
        _current.model = self._model
        return self._func(requests)

    def execute(self, requests: list[Request]) -> list[Response]:
        try:
            results = self._call(self._requests(requests))
            if self._decoupled:
                return self._stream(requests, results)
            if inspect.isgenerator(results):
                raise PyTritonValidationError("model '%s' returned a generator but is not decoupled "
                                              "(ModelConfig(decoupled=True))" % self._model.name)
            return self._responses(requests, results)
        except Exception as exc:
            error = _error(exc)
            return [Response(error=error) for _ in requests]

    def _responses(self, requests: list[Request], results: Any) -> list[Response]:
        if isinstance(results, dict):
            results = [results]
        if not isinstance(results, (list, tuple)) or len(results) != len(requests):
            raise PyTritonValidationError(
                "model '%s': the inference callable must return a list of %d dicts (one per request), got %s"
                % (self._model.name, len(requests), _describe(results)))
        return [self._response(result) for result in results]

    def _response(self, result: Any) -> Response:
        if not isinstance(result, dict):
            raise PyTritonValidationError("model '%s': a result must be a dict of output name -> numpy array, "
                                          "got %s" % (self._model.name, type(result).__name__))
        outputs = []
        for name, value in result.items():
            outputs.append(self._output(str(name), value))
        return Response(outputs)

    def _output(self, name: str, value: Any) -> Tensor:
        model = self._model.name
        if name not in self._out_dtypes:
            raise PyTritonValidationError("model '%s' returned output '%s', which is not among its outputs (%s)"
                                          % (model, name, ", ".join(self._out_dtypes)))
        if not isinstance(value, np.ndarray):
            raise PyTritonValidationError("output '%s' of model '%s' is %s, not a numpy array"
                                          % (name, model, type(value).__name__))
        want = self._out_dtypes[name]
        datatype = self._datatypes[name]
        if datatype == "BYTES":
            if value.dtype.kind not in "OSU" and self._model.strict:
                raise PyTritonValidationError("output '%s' of model '%s' has dtype %s, expected bytes"
                                              % (name, model, value.dtype))
            return Tensor(name, "BYTES", value if value.dtype.kind in "OSU" else value.astype(np.bytes_))
        if value.dtype != want:
            if self._model.strict:
                raise PyTritonValidationError("output '%s' of model '%s' has dtype %s, expected %s"
                                              % (name, model, value.dtype, want))
            try:
                value = value.astype(want)
            except (TypeError, ValueError) as exc:
                raise PyTritonValidationError("output '%s' of model '%s': cannot convert %s to %s (%s)"
                                              % (name, model, value.dtype, want, exc)) from None
        if self._model.strict:
            self._check_shape(name, value)
        return Tensor(name, datatype, value)

    def _check_shape(self, name: str, value: np.ndarray) -> None:
        declared = self._out_shapes[name] or (1,)
        shape = value.shape[1:] if self._batched else value.shape
        if len(shape) != len(declared) or any(d != -1 and d != s for d, s in zip(declared, shape)):
            raise PyTritonValidationError("output '%s' of model '%s' has shape %s, expected %s%s"
                                          % (name, self._model.name, list(value.shape),
                                             "[batch] + " if self._batched else "", list(declared)))

    def _stream(self, requests: list[Request], results: Any) -> list[Response]:
        """Decoupled: every yielded item (a dict, or a list of dicts: one per request) is sent at once."""
        assert self._context is not None and self._context.emit is not None
        emit = self._context.emit
        items = results if inspect.isgenerator(results) or isinstance(results, (list, tuple)) else [results]
        try:
            for item in items:
                if isinstance(item, dict):
                    item = [item]
                if not isinstance(item, (list, tuple)) or len(item) != len(requests):
                    raise PyTritonValidationError(
                        "model '%s': each yielded item must be a list of %d dicts (one per request), got %s"
                        % (self._model.name, len(requests), _describe(item)))
                for request, result in zip(requests, item):
                    if result is not None:
                        emit(request, self._response(result), False)
        except Exception as exc:
            error = _error(exc)
            for request in requests:
                emit(request, Response(error=error), False)
        for request in requests:
            emit(request, None, True)
        return [Response() for _ in requests]


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "a %s of %d" % (type(value).__name__, len(value))
    return type(value).__name__
