"""The router: every KServe v2 / Triton HTTP endpoint (reference/triton.md §1.1) over a DataPlane.

`Router(dataplane, ...)` is the server's handler. What every data plane answers at once (liveness,
server and model metadata, model config) is answered with a Response; the control calls (readiness,
statistics, repository, shared memory registration, settings) return a coroutine awaiting the data
plane's, as do load and unload. An inference resolves its model once (DataPlane.model, a handle the codec
and the data plane share) and is refused before any task is created when it is malformed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import orjson
from inferd.supervisor import header_rules as access
from inferd.supervisor.core.dataplane import DataPlane
from inferd.supervisor.core.model_handle import ModelHandle
from inferd.supervisor.inference.types import InferResponse
from inferd.supervisor.tracing import live
from inferd.worker.wire.errors import invalid_arg

from . import errors
from .codec import InferCodec, Limits, ParsedInfer
from .compression import decode_content, encode_content, pick_encoding
from .generate import Generate
from .request_cycle import Deferred
from .server import HandlerResult, Request, Response

CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)

log = logging.getLogger("inferd.http")

_EMPTY_OK = Response(200, b"", None)
_NOT_READY = Response(400, b"", None)
_VERSION_NOT_READY = Response(400, b'{"error":"Model version not ready"}')
_DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"
_ROUTE_CACHE_SIZE = 1024  # distinct paths remembered (cleared when full)
_OFFLOAD_BYTES = 256 * 1024  # (de)compression above this size runs in the default executor

GET = frozenset({"GET"})
POST = frozenset({"POST"})
GET_POST = frozenset({"GET", "POST"})

# restricted-API categories (Triton's --http-restricted-api names)
HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"

Route = tuple[str, frozenset[str], Callable[..., HandlerResult], tuple[Any, ...]]
_new_deferred = object.__new__


def _is_version(v: str) -> bool:
    return v.isascii() and v.isdigit()


def _json(obj: Any) -> Response:
    return Response(200, orjson.dumps(obj))


async def _readiness(pending: Awaitable[bool], not_ready: Response) -> Response:
    """A readiness answer the data plane gives once asked (DataPlane.ready_async / model_ready_async)."""
    try:
        ready = await pending
    except Exception as exc:
        return errors.from_exception(exc)
    return _EMPTY_OK if ready else not_ready


async def _json_later(pending: Awaitable[Any]) -> Response:
    """The JSON answer of a control call (awaited: a frontend process asks the core)."""
    try:
        return _json(await pending)
    except Exception as exc:
        return errors.from_exception(exc)


class Router:
    def __init__(self, dataplane: DataPlane, *, max_input_size: int = 64 * 1024 * 1024,
                 limits: Limits | None = None,
                 restricted: dict[str, tuple[str, str]] | None = None,
                 header_forward_pattern: str = "") -> None:
        """`restricted`: category -> (header name, required value), from --http-restricted-api;
        `header_forward_pattern`: --http-header-forward-pattern (see access.py for both)."""
        self.dp = dataplane
        self.limits = limits or Limits(max_input_size=max_input_size)
        self.max_input_size = self.limits.max_input_size
        self.codec = InferCodec(dataplane, self.limits)
        self.generate = Generate(dataplane, self.max_input_size)  # /generate, /generate_stream
        self.restricted = access.http_restrictions(restricted or {})
        self.forward = access.forward_pattern(header_forward_pattern)
        self._routes: dict[str, Route] = {}  # path -> route (a route depends on the path alone)
        self._done = self._infer_done  # bound once: an inference's Deferred finishes with it

    # ------------------------------------------------------------ dispatch
    def __call__(self, req: Request) -> HandlerResult:
        path = req.path
        route = self._routes.get(path)
        if route is None:
            route = self._route(path)
            if route is None:
                return errors.NOT_FOUND
            if len(path) <= 256:
                if len(self._routes) >= _ROUTE_CACHE_SIZE:
                    self._routes.clear()
                self._routes[path] = route
        category, methods, fn, args = route
        if self.restricted and category in self.restricted:
            rule = self.restricted[category]
            if not rule.allows(req.headers.get(rule.header)):
                return errors.restricted(rule.message)
        if req.method not in methods:
            return errors.METHOD_NOT_ALLOWED
        try:
            return fn(req, *args)
        except Exception as exc:
            return errors.from_exception(exc)

    def _route(self, path: str) -> Route | None:
        parts = path.split("/")
        if "%" in path:
            parts = [unquote(p, errors="replace") if "%" in p else p for p in parts]
        if len(parts) < 2 or parts[0] != "" or parts[1] != "v2":
            return None
        return self._match(parts[2:])

    def _match(self, p: list[str]) -> Route | None:
        n = len(p)
        if n == 0 or (n == 1 and p[0] == ""):
            return METADATA, GET, self._server_metadata, ()
        head = p[0]
        if head == "models":
            if n == 2 and p[1] == "stats":
                return STATISTICS, GET, self._stats, ("", "")
            if n < 2 or not p[1]:
                return None
            model = p[1]
            rest = p[2:]
            version = ""
            if len(rest) >= 2 and rest[0] == "versions":
                version = rest[1]
                if not _is_version(version):
                    return None
                rest = rest[2:]
            if not rest:
                return METADATA, GET, self._model_metadata, (model, version)
            if len(rest) == 1:
                what = rest[0]
                if what == "infer":
                    return INFERENCE, POST, self._infer, (model, version)
                if what == "generate":
                    return INFERENCE, POST, self.generate.generate, (model, version)
                if what == "generate_stream":
                    return INFERENCE, POST, self.generate.generate_stream, (model, version)
                if what == "ready":
                    return HEALTH, GET, self._model_ready, (model, version)
                if what == "config":
                    return MODEL_CONFIG, GET, self._model_config, (model, version)
                if what == "stats":
                    return STATISTICS, GET, self._stats, (model, version)
            if rest == ["trace", "setting"] and not version:
                return TRACE, GET_POST, self._trace, (model,)
            return None
        if head == "health" and n == 2:
            if p[1] == "live":
                return HEALTH, GET, self._live, ()
            if p[1] == "ready":
                return HEALTH, GET, self._ready, ()
            return None
        if head == "repository":
            if p[1:] == ["index"]:
                return MODEL_REPOSITORY, POST, self._repo_index, ()
            if n == 4 and p[1] == "models" and p[2] and p[3] in ("load", "unload"):
                return MODEL_REPOSITORY, POST, self._repo_control, (p[3], p[2])
            if n == 5 and p[2] == "models" and p[3] and p[4] in ("load", "unload"):
                return MODEL_REPOSITORY, POST, self._repo_named, ()
            return None
        if head in ("systemsharedmemory", "cudasharedmemory"):
            kind = "system" if head == "systemsharedmemory" else "cuda"
            region = ""
            rest = p[1:]
            if len(rest) >= 2 and rest[0] == "region" and rest[1]:
                region = rest[1]
                rest = rest[2:]
            if rest == ["status"]:
                return SHARED_MEMORY, GET, self._shm_status, (kind, region)
            if rest == ["unregister"]:
                return SHARED_MEMORY, POST, self._shm_unregister, (kind, region)
            if rest == ["register"]:
                return SHARED_MEMORY, POST, self._shm_register, (kind, region)
            return None
        if p == ["trace", "setting"]:
            return TRACE, GET_POST, self._trace, ("",)
        if head == "inferd" and n >= 2 and p[1] == "status":
            # inferd's own status view (infer-ctl status; not a Triton endpoint)
            if n == 2:
                return MODEL_REPOSITORY, GET, self._inferd_status, ("",)
            if n == 4 and p[2] == "models" and p[3]:
                return MODEL_REPOSITORY, GET, self._inferd_status, (p[3],)
            return None
        if head == "inferd" and n == 4 and p[1] == "models" and p[2] and p[3] == "restart":
            # inferd's rolling restart of a model's workers (infer-ctl restart; not a Triton endpoint)
            return MODEL_REPOSITORY, POST, self._inferd_restart, (p[2],)
        if p == ["logging"]:
            return LOGGING, GET_POST, self._logging, ()
        return None

    # ------------------------------------------------------------ helpers
    def _body_json(self, req: Request) -> Any:
        """The (small) JSON body of a control request, None when empty."""
        body = decode_content(req.headers.get("content-encoding"), req.body, self.max_input_size)
        if not len(body):
            return None
        try:
            return orjson.loads(body)
        except (orjson.JSONDecodeError, RecursionError, ValueError) as exc:
            raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None

    def _body_object(self, req: Request) -> dict[str, Any]:
        doc = self._body_json(req)
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            raise invalid_arg("the request body must be a JSON object")
        return doc

    # ------------------------------------------------------------ health & metadata
    def _live(self, req: Request) -> Response:
        return _EMPTY_OK if self.dp.live() else _NOT_READY

    def _ready(self, req: Request) -> HandlerResult:
        return _readiness(self.dp.ready_async(), _NOT_READY)

    def _server_metadata(self, req: Request) -> Response:
        return _json(self.dp.server_metadata())

    def _model_metadata(self, req: Request, model: str, version: str) -> Response:
        return _json(self.dp.model(model, version).metadata())

    def _model_ready(self, req: Request, model: str, version: str) -> HandlerResult:
        # (a Python model's is_ready() may be asked: python_backend after 2.51)
        return _readiness(self.dp.model_ready_async(model, version), _VERSION_NOT_READY)

    def _model_config(self, req: Request, model: str, version: str) -> Response:
        return _json(self.dp.model(model, version).config())

    def _stats(self, req: Request, model: str, version: str) -> HandlerResult:
        return _json_later(self.dp.model_statistics_async(model, version))

    # ------------------------------------------------------------ inference
    def _infer(self, req: Request, model: str, version: str) -> HandlerResult:
        handle = self.dp.model(model, version)  # the one lookup of this request's model
        if handle.decoupled:
            return errors.error_response(501, _DECOUPLED)
        encoding = req.headers.get("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            return self._infer_compressed(req, handle, encoding)
        parsed = self.codec.parse(model, version, req.headers, req.body, handle)
        parsed.request.model = handle
        if self.forward is not None:
            self._forward(req, parsed)
        if live.armed:  # tracing: a client's W3C trace context is continued
            parsed.request.trace_parent = req.headers.get("traceparent")
        accept = req.headers.get("accept-encoding")
        if accept is None or pick_encoding(accept) is None:
            # the common case: no task per request, the response is built in a done-callback
            deferred = _new_deferred(Deferred)  # its fields set here: a frame less than Deferred(...)
            deferred.future = self.dp.infer_nowait(parsed.request)
            deferred.finish = self._done
            deferred.context = parsed
            return deferred
        return self._infer_run(req, parsed)

    def _infer_done(self, parsed: ParsedInfer, future: asyncio.Future[InferResponse]) -> Response:
        try:
            return self.codec.build(parsed, future.result())
        except Exception as exc:
            return errors.from_exception(exc)
        finally:
            if parsed.hold is not None:
                parsed.hold.release()  # its shm regions are free to unregister once its outputs are written

    async def _infer_compressed(self, req: Request, handle: ModelHandle, encoding: str) -> Response:
        try:
            if len(req.body) > _OFFLOAD_BYTES // 4:
                loop = asyncio.get_running_loop()
                body = await loop.run_in_executor(None, decode_content, encoding, req.body,
                                                  self.max_input_size)
            else:
                body = decode_content(encoding, req.body, self.max_input_size)
            parsed = self.codec.parse(handle.name, handle.version, req.headers, body, handle)
            parsed.request.model = handle
            if self.forward is not None:
                self._forward(req, parsed)
            if live.armed:
                parsed.request.trace_parent = req.headers.get("traceparent")
        except Exception as exc:
            return errors.from_exception(exc)
        return await self._infer_run(req, parsed)

    def _forward(self, req: Request, parsed: ParsedInfer) -> None:
        """--http-header-forward-pattern: matching headers become string parameters, after the
        request's own (names as sent when the server keeps them, else lower-cased)."""
        headers = req.raw_headers if req.raw_headers is not None else req.headers.items()
        assert self.forward is not None
        access.forward_http(self.forward, headers, parsed.request.parameters)

    async def _infer_run(self, req: Request, parsed: ParsedInfer) -> Response:
        try:
            resp = await self.dp.infer(parsed.request)
            res = self.codec.build(parsed, resp)
            encoding = pick_encoding(req.headers.get("accept-encoding"))
            if encoding is not None:
                await self._compress(res, encoding)
            return res
        except Exception as exc:
            return errors.from_exception(exc)
        finally:
            if parsed.hold is not None:
                parsed.hold.release()

    @staticmethod
    async def _compress(res: Response, encoding: str) -> None:
        body = res.body
        raw = body if isinstance(body, bytes) else b"".join(bytes(b) for b in body)
        if len(raw) > _OFFLOAD_BYTES:
            res.body = await asyncio.get_running_loop().run_in_executor(None, encode_content, encoding, raw)
        else:
            res.body = encode_content(encoding, raw)
        res.headers = dict(res.headers or {}, **{"Content-Encoding": encoding})

    # ------------------------------------------------------------ repository
    def _repo_index(self, req: Request) -> HandlerResult:
        doc = self._body_object(req)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("'ready' must be a boolean")
        return _json_later(self.dp.repository_index_async(ready))

    def _repo_named(self, req: Request) -> Response:
        return errors.error_response(501, "'repository_name' specification is not supported")

    def _repo_control(self, req: Request, action: str, model: str) -> Awaitable[Response]:
        doc = self._body_object(req)
        params = doc.get("parameters", {})
        if not isinstance(params, dict):
            raise invalid_arg("'parameters' must be a JSON object")
        if action == "load":
            load_params: dict[str, Any] = {}
            for key, value in params.items():
                if key == "config":
                    if not isinstance(value, str):
                        raise invalid_arg("load parameter 'config' must be a string holding JSON")
                    load_params[key] = value
                elif key.startswith("file:"):
                    if not isinstance(value, str):
                        raise invalid_arg(f"load parameter '{key}' must be a base64 string")
                    try:
                        load_params[key] = base64.b64decode(value, validate=True)
                    except (binascii.Error, ValueError):
                        raise invalid_arg(f"load parameter '{key}' is not valid base64") from None
                else:
                    load_params[key] = value
            return self._control(self.dp.load_model(model, load_params))
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid_arg("'unload_dependents' must be a boolean")
        return self._control(self.dp.unload_model(model, dependents))

    @staticmethod
    async def _control(op: Awaitable[None]) -> Response:
        try:
            await op
        except Exception as exc:
            return errors.from_exception(exc)
        return _EMPTY_OK

    # ------------------------------------------------------------ shared memory
    def _shm_status(self, req: Request, kind: str, region: str) -> HandlerResult:
        return _json_later(self.dp.shm_status_async(kind, region))

    def _shm_unregister(self, req: Request, kind: str, region: str) -> HandlerResult:
        return self._control(self.dp.shm_unregister_async(kind, region))

    def _shm_register(self, req: Request, kind: str, region: str) -> HandlerResult:
        self.dp.shm_check_allowed()  # Triton's order: the disabled answer before the body is looked at
        if not region:
            raise invalid_arg("'region name' is necessary to register %s shared memory region" % kind)
        doc = self._body_object(req)
        raw = self._cuda_handle(doc) if kind == "cuda" else b""  # Triton checks the handle first
        size = doc.get("byte_size")
        if type(size) is not int or size < 0:
            raise invalid_arg("'byte_size' must be a non-negative integer")
        if kind == "system":
            key = doc.get("key")
            offset = doc.get("offset", 0)
            if not isinstance(key, str) or not key:
                raise invalid_arg("'key' must be a non-empty string")
            if type(offset) is not int or offset < 0:
                raise invalid_arg("'offset' must be a non-negative integer")
            return self._control(self.dp.shm_register_async(kind, region, key=key, offset=offset, byte_size=size))
        device = doc.get("device_id", 0)
        if type(device) is not int or device < 0:
            raise invalid_arg("'device_id' must be a non-negative integer")
        return self._control(self.dp.shm_register_async(kind, region, raw_handle=raw, device_id=device,
                                                        byte_size=size))

    @staticmethod
    def _cuda_handle(doc: dict[str, Any]) -> bytes:
        """The cudaIpcMemHandle_t of a CUDA registration ({"raw_handle": {"b64": ...}}), Triton's messages."""
        if "raw_handle" not in doc:
            raise invalid_arg("Shared memory register request has no 'raw_handle' field")
        handle = doc["raw_handle"]
        b64 = handle.get("b64") if isinstance(handle, dict) else None
        raw = b""
        if isinstance(b64, str):
            try:
                raw = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
        if len(raw) != CUDA_IPC_HANDLE_BYTES:
            raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        return raw

    def _inferd_status(self, req: Request, model: str) -> HandlerResult:
        return _json_later(self.dp.status_async(model))

    async def _inferd_restart(self, req: Request, model: str) -> Response:
        try:
            doc = await self.dp.restart_model(model)
        except Exception as exc:
            return errors.from_exception(exc)
        return _json(doc)

    # ------------------------------------------------------------ settings
    def _trace(self, req: Request, model: str) -> HandlerResult:
        update = self._body_object(req) if req.method == "POST" else None
        return _json_later(self.dp.trace_settings_async(model, update))

    def _logging(self, req: Request) -> HandlerResult:
        update = self._body_object(req) if req.method == "POST" else None
        return _json_later(self.dp.log_settings_async(update))

