"""Triton's Python backend semantics: `<model_dir>/<version>/model.py` defining `TritonPythonModel`.

- Import: `<model_dir>/<version>` and `<model_dir>` are appended to sys.path (as Triton does) so helper
  modules beside model.py import; the file itself is loaded under a module name unique to the model,
  so two models' `model.py` never clash in sys.modules.
- `auto_complete_config(pb_utils.ModelConfig)` (static), `initialize(args)` with Triton's keys,
  `execute(requests)` (plain or `async def`: coroutines run on a per-instance event loop thread),
  `finalize()`.
- Return rules and error texts of Triton's stub; an exception escaping execute fails every request
  of the batch with `Failed to process the request(s) for model '<instance>', message: <Type>: <msg>`
  (traceback in the log, not in the reply). Outputs are pruned to the requested ones.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, Optional

from ..compat import load_pb_utils
from ..wire.errors import ErrorCode, InferdError
from .base import ModelSpec, Request, Response, Tensor, WorkerContext

DEFAULT_MODEL_FILENAME = "model.py"


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
        self._loop: Any = None
        self._loop_thread: Optional[threading.Thread] = None
        self._output_names: list[str] = []
        self._version = -1
        self._poll: Optional[Callable[[], None]] = None
        self._emit: Any = None  # WorkerContext.emit, for decoupled models

    # ---- import ---------------------------------------------------------------------------------

    def _import_model(self, spec: ModelSpec, log_verbose: int) -> Any:
        version_dir = os.path.join(spec.model_dir, spec.version)
        filename = spec.config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        if not filename.endswith(".py") or os.sep in filename:
            raise InferdError(
                ErrorCode.INVALID_ARG, "Model name must end with '.py'. Model name is \"%s\"." % filename
            )
        path = os.path.join(version_dir, filename)
        if not os.path.isfile(path):
            raise InferdError(ErrorCode.NOT_FOUND, "Python model file not found in '%s'" % path)
        self._model_path = path
        self._pb._configure(model_dir=version_dir, log_verbose=log_verbose, instance=spec.instance_name,
                            model=spec.model_name, version=spec.version)
        for entry in (version_dir, spec.model_dir):
            if entry not in sys.path:
                sys.path.append(entry)
        # The model file is a module of a package whose path is the version directory, as Triton
        # imports `<version>.model`: `from .helper import x` finds <version>/helper.py. The package
        # name is unique per model file: two models' model.py never share a module (nor a stale one).
        digest = hashlib.sha1(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:10]
        package = "inferd_model_%s_%s_%s" % (
            re.sub(r"\W", "_", spec.model_name), re.sub(r"\W", "_", spec.version), digest
        )
        module_name = package + "." + filename[: -len(".py")]
        module = sys.modules.get(module_name)
        if module is not None:
            return module
        import importlib.util
        import types

        parent = types.ModuleType(package)
        parent.__path__ = [version_dir]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise InferdError(ErrorCode.INTERNAL, "cannot import Python model file '%s'" % path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[package] = parent
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            sys.modules.pop(package, None)
            self._log_exception("importing %s" % path)
            raise InferdError(ErrorCode.INTERNAL, _describe(exc)) from None
        if not isinstance(getattr(module, "TritonPythonModel", None), type):
            sys.modules.pop(module_name, None)
            raise InferdError(
                ErrorCode.INTERNAL,
                "AttributeError: Python model file '%s' does not define class 'TritonPythonModel'" % path,
            )
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

    def execute(self, requests: list[Request]) -> list[Response]:
        spec = self._spec
        if spec is None or self._model is None:
            raise InferdError(ErrorCode.UNAVAILABLE, "model is not loaded")
        pb = self._pb
        version = self._version
        wrap = pb.Tensor._wrap
        from_worker = pb.InferenceRequest._from_worker
        model_name = spec.model_name
        pb_requests = []
        for r in requests:
            inputs = [wrap(t.name, t.array, t.datatype) for t in r.inputs]
            requested = list(r.requested_outputs) if r.requested_outputs else list(self._output_names)
            pb_requests.append(
                from_worker(
                    r.id, r.correlation_id, inputs, requested, model_name, version, r.flags,
                    r.timeout_us, r.parameters, r.is_cancelled, r.trace,
                )
            )
        if self._emit is not None:
            return self._execute_decoupled(requests, pb_requests)
        try:
            execute = getattr(self._model, "execute", None)
            if execute is None:
                raise _ReturnRuleError(
                    "Python model %s does not implement `execute` method." % self._model_path
                )
            returned = self._resolve(execute(pb_requests))
            pb_responses = self._check_returned(pb_requests, returned)
        except (Exception, SystemExit) as exc:
            message = "Failed to process the request(s) for model '%s', message: %s" % (
                spec.instance_name, _describe(exc),
            )
            self._log_exception(message)
            error = InferdError(ErrorCode.INTERNAL, message)
            return [Response(error=error) for _ in requests]
        return [self._convert(req, resp) for req, resp in zip(pb_requests, pb_responses)]

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
            returned = self._resolve(execute(pb_requests))
            if returned is not None:
                raise _ReturnRuleError(
                    "Python model '%s' is using the decoupled mode and the execute function must return None."
                    % spec.instance_name
                )
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

    def _stream_to(self, request: Request, pb_request: Any) -> Callable[[Any, bool], None]:
        emit = self._emit

        def stream(pb_response: Any, final: bool) -> None:
            response = self._convert(pb_request, pb_response) if pb_response is not None else None
            emit(request, response, final)

        return stream

    def unload(self) -> Optional[InferdError]:
        model, self._model = self._model, None
        error = None
        finalize = getattr(model, "finalize", None) if model is not None else None
        if finalize is not None:
            try:
                self._resolve(finalize())
            except Exception as exc:
                self._log_exception("finalize")
                error = InferdError(ErrorCode.INTERNAL, _describe(exc))
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=1.0)
            self._loop = None
        return error

    # ---- helpers --------------------------------------------------------------------------------

    def _resolve(self, value: Any) -> Any:
        """Run a coroutine returned by a model hook to completion on the instance's event loop."""
        if type(value) is list or value is None:  # what execute usually returns: skip the hasattr probe
            return value
        if type(value).__name__ != "coroutine" and not hasattr(value, "__await__"):
            return value
        import asyncio

        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="inferd-model-loop", daemon=True)
            thread.start()
            self._loop, self._loop_thread = loop, thread
        if not asyncio.iscoroutine(value):
            value = _await(value)
        future = asyncio.run_coroutine_threadsafe(value, self._loop)
        if self._poll is None:
            return future.result()
        while True:  # keep serving cancellation probes while the coroutine runs
            try:
                return future.result(timeout=0.02)
            except concurrent.futures.TimeoutError:
                self._poll()

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
        for request, response in zip(requests, returned):
            if response is None:
                continue
            if not isinstance(response, pb.InferenceResponse):
                raise _ReturnRuleError(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    "found type '%s'." % _type_str(response)
                )
            sender = request._sender
            if sender is not None and sender.closed:
                raise _ReturnRuleError("Unable to send response. Response sender has been closed.")
        return returned

    def _convert(self, request: Any, response: Any) -> Response:
        if response is None:
            sender = request._sender
            if sender is None or not sender.responses:
                return Response(
                    error=InferdError(
                        ErrorCode.INTERNAL,
                        "Failed to process the request(s) for model '%s', message: no response was "
                        "returned or sent for the request" % (self._spec.instance_name if self._spec else ""),
                    )
                )
            response = sender.responses[0]
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


async def _await(awaitable: Any) -> Any:
    return await awaitable
