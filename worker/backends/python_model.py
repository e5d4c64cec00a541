"""Triton's Python backend semantics: `<model_dir>/<version>/model.py` defining `TritonPythonModel`.

- Import (python_import.py): `<model_dir>/<version>` and `<model_dir>` are appended to sys.path (as Triton
  does) so helper modules beside model.py import; the file itself is loaded under a module name unique to
  the model, so two models' `model.py` never clash in sys.modules. A Python-based backend's model.py comes
  from its backend directory instead.
- `auto_complete_config(pb_utils.ModelConfig)` (static), `initialize(args)` with Triton's keys,
  `execute(requests)` (plain or `async def`: coroutines run on a per-instance event loop thread,
  model_loop.py; a decoupled model's run in the background, so executions overlap), `finalize()`.
  BLS only between initialize and finalize, as Triton.
- Non-decoupled response senders: python_senders.py; request rescheduling: python_reschedule.py.
- Return rules and error texts of Triton's stub; an exception escaping execute fails every request
  of the batch with `Failed to process the request(s) for model '<instance>', message: <Type>: <msg>`
  (traceback in the log, not in the reply). Outputs are pruned to the requested ones.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Optional

from ..compat import load_pb_utils
from ..wire.errors import ErrorCode, InferdError
from . import python_import
from . import python_reschedule as reschedule
from . import python_senders as senders
from .base import ModelSpec, PlainRequests, Request, Response, Tensor, WorkerContext
from .model_loop import ModelLoop, is_awaitable
from .python_plain import alike_results, plain_results

_RESCHEDULE = reschedule.RESCHEDULE


class _ReturnRuleError(Exception):
    """A broken execute() contract; its message is reported without a type prefix (as Triton)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _ReturnRuleError):
        return str(exc)
    return "%s: %s" % (type(exc).__name__, exc)


def _type_str(obj: Any) -> str:
    return str(type(obj))


def force_cpu_only_inputs(config: dict[str, Any]) -> bool:
    """The model parameter FORCE_CPU_ONLY_INPUT_TENSORS, as Triton reads it: "yes" (the default)
    copies every input to the CPU; "no" lets an input that a GPU produced arrive on the GPU.
    Anything else fails the load."""
    params = config.get("parameters") or {}
    entry = params.get("FORCE_CPU_ONLY_INPUT_TENSORS") if isinstance(params, dict) else None
    if entry is None:
        return True
    value = entry.get("string_value", "") if isinstance(entry, dict) else entry
    text = str(value).strip().lower()
    if text == "yes":
        return True
    if text == "no":
        return False
    raise InferdError(ErrorCode.INVALID_ARG,
                      "Expected either 'no' or 'yes' for 'FORCE_CPU_ONLY_INPUT_TENSORS', found '%s'" % value)


class PythonBackend:
    name = "python"
    supports_auto_complete = True
    supports_decoupled = True
    # as Triton's Python backend: outputs go with the datatype and shape the model gave them
    checks_outputs = False
    device_inputs = False  # FORCE_CPU_ONLY_INPUT_TENSORS "no": inputs a GPU produced stay on the GPU

    def __init__(self) -> None:
        self._pb = load_pb_utils()
        self._spec: Optional[ModelSpec] = None
        self._model: Any = None
        self._model_path = ""
        self._loop = ModelLoop()
        self._output_names: list[str] = []
        self._version = -1
        self._poll: Optional[Callable[[], None]] = None
        self._emit: Any = None  # WorkerContext.emit, for decoupled models
        self._iterative = False  # sequence_batching.iterative_sequence: requests may be rescheduled

    # ---- import ---------------------------------------------------------------------------------

    def _import_model(self, spec: ModelSpec, log_verbose: int) -> Any:
        version_dir = os.path.join(spec.model_dir, spec.version)
        self._pb._configure(model_dir=version_dir, log_verbose=log_verbose, instance=spec.instance_name,
                            model=spec.model_name, version=spec.version)
        module, self._model_path = python_import.import_model(spec, self._log_exception)
        return module

    # ---- Backend protocol -----------------------------------------------------------------------

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        module = self._import_model(model, 0)
        cls = module.TritonPythonModel
        pb = self._pb
        result = pb.ModelConfig(json.dumps(config))
        hook = getattr(cls, "auto_complete_config", None)
        if hook is not None:
            try:
                result = hook(result)
            except Exception as exc:
                self._log_exception("auto_complete_config")
                raise InferdError(ErrorCode.INTERNAL, _describe(exc)) from None
        if not isinstance(result, pb.ModelConfig):
            raise InferdError(
                ErrorCode.INTERNAL,
                "auto_complete_config function in model '%s' must return a valid pb.ModelConfig object."
                % model.model_name,
            )
        completed: dict[str, Any] = result.as_dict()
        return completed

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        if model.decoupled and context.emit is None:
            raise InferdError(ErrorCode.UNSUPPORTED, "this worker cannot stream responses of decoupled models")
        self.device_inputs = not force_cpu_only_inputs(model.config)
        module = self._import_model(model, context.log_verbose)
        self._poll = context.poll
        self._emit = context.emit if model.decoupled else None
        self._spec = model
        self._version = int(model.version) if model.version.isdigit() else -1
        self._iterative = bool((model.config.get("sequence_batching") or {}).get("iterative_sequence"))
        self._output_names = model.output_names
        args = {
            "model_config": model.config_json,
            "model_instance_kind": model.instance_kind,
            "model_instance_name": model.instance_name,
            "model_instance_device_id": str(model.device_id),
            "model_repository": model.model_dir,
            "model_version": model.version,
            "model_name": model.model_name,
        }
        try:
            instance = module.TritonPythonModel()
            init = getattr(instance, "initialize", None)
            if init is not None:
                self._resolve(init(args))
        except Exception as exc:
            self._log_exception("initialize")
            raise InferdError(ErrorCode.INTERNAL, _describe(exc)) from None
        self._model = instance
        self._pb._state["bls_allowed"] = True  # as Triton's stub: BLS only once initialized, until finalize

    def execute(self, requests: list[Request]) -> Sequence[Response]:
        spec = self._spec
        if spec is None or self._model is None:
            raise InferdError(ErrorCode.UNAVAILABLE, "model is not loaded")
        pb = self._pb
        version = self._version
        pb_requests = pb.InferenceRequest._batch_from_worker(requests, self._output_names, spec.model_name, version,
                                                             type(requests) is PlainRequests)
        if self._emit is not None:
            return self._execute_decoupled(requests, pb_requests)
        try:
            execute = getattr(self._model, "execute", None)
            if execute is None:
                raise _ReturnRuleError(
                    "Python model %s does not implement `execute` method." % self._model_path
                )
            returned = execute(pb_requests)
            if type(returned) is not list:
                returned = self._resolve(returned)
            if not self._iterative:  # the usual answers, checked and converted in one pass
                if len(pb_requests) > 1:  # (a batch of one goes request by request: no columns)
                    alike = alike_results(pb_requests, returned, pb.InferenceResponse)
                    if alike is not None:
                        return alike
                plain = plain_results(pb_requests, returned, pb.InferenceResponse)
                if plain is not None:
                    return plain
            pb_responses = self._check_returned(pb_requests, returned)
            if self._iterative:
                pb_responses = reschedule.run_again(pb_requests, pb_responses, lambda again: self._check_returned(
                    again, self._resolve(execute(again))))
            else:
                for r in pb_requests:  # _no_reschedule, inline
                    if r._release_flags & _RESCHEDULE:
                        raise _ReturnRuleError(reschedule.NOT_ITERATIVE)
        except (Exception, SystemExit) as exc:
            message = "Failed to process the request(s) for model '%s', message: %s" % (
                spec.instance_name, _describe(exc),
            )
            self._log_exception(message)
            return [senders.after_failure(req, message, self._convert) for req in pb_requests]
        results = []
        for req, resp in zip(pb_requests, pb_responses):
            if resp is None:
                results.append(senders.await_sent(req, self._poll, self._convert, self._no_response))
            elif resp._error is None and resp._parameters == "{}":  # _convert's usual case, in short
                wanted = req._requested
                outputs = []
                for t in resp._outputs:
                    if t._name in wanted:
                        outputs.append(Tensor(t._name, t._datatype, t._array))
                results.append(Response(outputs, None, {}))
            else:
                results.append(self._convert(req, resp))
        return results

    def _no_response(self) -> Response:
        return Response(error=InferdError(
            ErrorCode.INTERNAL, "Failed to process the request(s) for model '%s', message: no response was "
            "returned or sent for the request" % (self._spec.instance_name if self._spec else "")))

    def _execute_decoupled(self, requests: list[Request], pb_requests: list[Any]) -> list[Response]:
        """Responses leave through each request's sender as the model sends them (any thread, also
        after execute returned). execute must return None; if it fails, the requests that have not
        sent FINAL end with the error (their senders close) and the others are left alone."""
        spec = self._spec
        assert spec is not None
        for request, pb_request in zip(requests, pb_requests):
            pb_request._stream = self._stream_to(request, pb_request)
        try:
            execute = getattr(self._model, "execute", None)
            if execute is None:
                raise _ReturnRuleError("Python model %s does not implement `execute` method." % self._model_path)
            returned = execute(pb_requests)
            if is_awaitable(returned):  # runs on the loop; the next batch is taken meanwhile
                self._start_background(returned, requests, pb_requests)
                return [Response() for _ in requests]
            self._check_decoupled_return(returned)
            if self._iterative:
                reschedule.run_again(pb_requests, [None] * len(pb_requests), self._execute_again)
            else:
                self._no_reschedule(pb_requests, [])
        except (Exception, SystemExit) as exc:
            message = "Failed to process the request(s) for model '%s', message: %s" % (
                spec.instance_name, _describe(exc),
            )
            self._log_exception(message)
            error = InferdError(ErrorCode.INTERNAL, message)
            results = []
            for pb_request in pb_requests:
                sender = pb_request.get_response_sender()
                results.append(Response(error=error) if sender._close() else Response())
            return results
        return [Response() for _ in requests]

    def _check_decoupled_return(self, returned: Any) -> None:
        if returned is not None:
            raise _ReturnRuleError(
                "Python model '%s' is using the decoupled mode and the execute function must return None."
                % (self._spec.instance_name if self._spec else ""))

    def _execute_again(self, pb_requests: list[Any]) -> list[Any]:
        """A decoupled model's rescheduled requests, run again (synchronous execute)."""
        self._check_decoupled_return(self._model.execute(pb_requests))
        return [None] * len(pb_requests)

    def _no_reschedule(self, pb_requests: list[Any], responses: list[Any]) -> list[Any]:
        if any(r._release_flags & reschedule.RESCHEDULE for r in pb_requests):
            raise _ReturnRuleError(reschedule.NOT_ITERATIVE)
        return responses

    def _start_background(self, coroutine: Any, requests: list[Request], pb_requests: list[Any]) -> None:
        self._loop.start(coroutine, lambda future: self._background_done(future, requests, pb_requests))

    def _background_done(self, future: Any, requests: list[Request], pb_requests: list[Any]) -> None:
        """A decoupled model's execute coroutine ended. Its result is not looked at (as Triton); if it
        failed, the traceback is logged (as Triton) and, where Triton would leave them hanging, the
        requests that have not sent FINAL end with the error."""
        exc = future.exception()
        if exc is None:
            again = reschedule.rescheduled(pb_requests) if self._iterative else []
            if again and self._model is not None:  # rescheduled: their execution runs again
                try:
                    self._start_background(self._model.execute([pb_requests[i] for i in again]),
                                           [requests[i] for i in again], [pb_requests[i] for i in again])
                    return
                except Exception as failed:
                    exc = failed
            else:
                return
        spec = self._spec
        message = "Failed to process the request(s) for model '%s', message: %s" % (
            spec.instance_name if spec else "", _describe(exc))
        self._pb.Logger._emit("%s\n%s" % (message, "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()), self._pb.Logger.ERROR, 2)
        error = InferdError(ErrorCode.INTERNAL, message)
        for request, pb_request in zip(requests, pb_requests):
            if pb_request.get_response_sender()._close():
                self._emit(request, Response(error=error), True)

    def _stream_to(self, request: Request, pb_request: Any) -> Callable[[Any, bool], None]:
        emit = self._emit

        def stream(pb_response: Any, final: bool) -> None:
            response = self._convert(pb_request, pb_response) if pb_response is not None else None
            emit(request, response, final)

        return stream

    def readiness_check(self) -> Optional[Callable[[], bool]]:
        """The model's is_ready() (python_backend after 2.51), if its object has one once initialized (as the
        stub looks): sync or async, it must return a bool. Runs on the readiness thread (worker/readiness.py);
        a coroutine runs on the instance's event loop, as async execute does."""
        if self._model is None or not hasattr(self._model, "is_ready"):
            return None

        def check() -> bool:
            model = self._model
            if model is None:
                raise InferdError(ErrorCode.UNAVAILABLE, "model is not loaded")
            result = model.is_ready()
            if is_awaitable(result):
                result = self._loop.run(result)
            if type(result) is not bool:
                raise InferdError(ErrorCode.INTERNAL, "is_ready() must return a boolean value")
            return result

        return check

    def unload(self) -> Optional[InferdError]:
        self._loop.drain()  # background executions of a decoupled model end before finalize
        model, self._model = self._model, None
        self._pb._state["bls_allowed"] = False
        error = None
        finalize = getattr(model, "finalize", None) if model is not None else None
        if finalize is not None:
            try:
                self._resolve(finalize())
            except Exception as exc:
                self._log_exception("finalize")
                error = InferdError(ErrorCode.INTERNAL, _describe(exc))
        self._loop.stop()
        return error

    # ---- helpers --------------------------------------------------------------------------------

    def _resolve(self, value: Any) -> Any:
        """Run a coroutine returned by a model hook to completion on the instance's event loop."""
        if not is_awaitable(value):
            return value
        return self._loop.run(value, self._poll)

    def _check_returned(self, requests: list[Any], returned: Any) -> list[Any]:
        pb = self._pb
        if returned is None:
            return [None] * len(requests)
        if not isinstance(returned, list):
            raise _ReturnRuleError(
                "Expected a list in the execute return, found type '%s'." % _type_str(returned)
            )
        if len(returned) != len(requests):
            raise _ReturnRuleError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                "InferenceRequest(s) size is:%d, and InferenceResponse(s) size is:%d\n"
                % (len(requests), len(returned))
            )
        response_type, rescheduled = pb.InferenceResponse, reschedule.RESCHEDULE
        senders = False
        for request, response in zip(requests, returned):
            if response is None:
                continue
            if request._release_flags & rescheduled:
                raise _ReturnRuleError(reschedule.NOT_NONE % _type_str(response))
            if type(response) is not response_type and not isinstance(response, response_type):
                raise _ReturnRuleError(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    "found type '%s'." % _type_str(response)
                )
            sender = request._sender
            if sender is not None:
                if sender.responses:
                    raise _ReturnRuleError(
                        "Unable to send response. Non-decoupled model cannot send more than one response.")
                if sender.closed:
                    raise _ReturnRuleError("Unable to send response. Response sender has been closed.")
                senders = True
        if senders:
            for request, response in zip(requests, returned):
                if response is not None and request._sender is not None:
                    request._sender._close()  # answered by the return: a later send is refused
        return returned

    def _convert(self, request: Any, response: Any) -> Response:
        params: dict[str, Any] = {}
        raw = response._parameters  # attributes, not the accessor methods: this runs per response
        if raw and raw != "{}":
            try:
                loaded = json.loads(raw)
                params = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                params = {}
        err = response._error
        if err is not None:
            code = err.code()
            try:
                error_code = ErrorCode(code)
            except ValueError:
                error_code = ErrorCode.INTERNAL
            return Response(None, InferdError(error_code, err.message()), params)
        wanted = request._requested
        outputs = [Tensor(t._name, t._datatype, t._array) for t in response._outputs if t._name in wanted]
        return Response(outputs, None, params)

    def _log_exception(self, what: str) -> None:
        self._pb.Logger._emit(
            "%s\n%s" % (what, traceback.format_exc().rstrip()), self._pb.Logger.ERROR, 2
        )


