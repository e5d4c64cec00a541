"""GRPCInferenceService and grpc.health.v1.Health over the data plane, as grpc.aio generic handlers.

We register our own method handlers instead of the generated servicer base class so the request
deserializer can catch undecodable bytes: grpc.aio would answer UNKNOWN with the parser's text,
clients expect INVALID_ARGUMENT (DESIGN.md, Known traps).

`Policy` carries --grpc-restricted-protocol and --grpc-header-forward-pattern (access.py): every RPC
has a category (CATEGORIES); a restricted one is refused with UNAVAILABLE unless its metadata is
there, and inference requests get the matching metadata as parameters. Both servers (this module's
handlers for grpcio, native_server.py's method table) apply the service's policy.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf import json_format
from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.supervisor._gen import health_pb2
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg

from .. import header_rules as access
from ..core.dataplane import DataPlane
from ..tracing import live
from . import convert, wire
from .convert import BAD, PARSE_ERROR, deserializer
from .errors import status_of
from .stream import StreamInfer

log = logging.getLogger("inferd.grpc")

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
DECOUPLED_UNARY = "ModelInfer RPC doesn't support models with decoupled transaction policy"


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]

# The restricted-API category of every RPC (tritonserver's grpc_restricted_protocol groups, observed
# on Triton 2.51; grpc.health.v1 Health/Check is "health" there too)
CATEGORIES: dict[str, str] = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


class Policy:
    """--grpc-restricted-protocol (category -> (key, value), as config.grpc_restricted) and
    --grpc-header-forward-pattern, as the service applies them (access.py)."""

    __slots__ = ("restricted", "forward")

    def __init__(self, restricted: Mapping[str, tuple[str, str]] | None = None, forward_pattern: str = "") -> None:
        self.restricted = access.grpc_restrictions(restricted or {})
        self.forward = access.forward_pattern(forward_pattern)

    @classmethod
    def of(cls, config: Any) -> Policy:
        return cls(getattr(config, "grpc_restricted", None), str(getattr(config, "grpc_header_forward_pattern", "")))

    def rule(self, rpc: str) -> access.Restriction | None:
        """What RPC `rpc` (its method name) requires, None when it is not restricted."""
        return self.restricted.get(CATEGORIES[rpc]) if self.restricted else None


def allowed(rule: access.Restriction, metadata: Any, encoding: str = "latin-1") -> bool:
    """Whether a call's metadata (name, value pairs) satisfies `rule`: the first value counts."""
    return rule.allows(access.first_value(metadata or (), rule.header), encoding)


def _unary(
    fn: Handler,
    req_cls: Any,
    resp_cls: Any,
    decode: Callable[[bytes], Any] | None = None,
    encode: Callable[[Any], bytes] | None = None,
    rule: access.Restriction | None = None,
) -> grpc.RpcMethodHandler:
    """`decode`/`encode` replace the protobuf (de)serializers; None with a None class = raw bytes.
    `rule`: the method is restricted (--grpc-restricted-protocol)."""

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if rule is not None and not allowed(rule, context.invocation_metadata(), "utf-8"):
            await context.abort(grpc.StatusCode.UNAVAILABLE, rule.message)
        if request is BAD:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, PARSE_ERROR)
        try:
            return await fn(request, context)
        except InferdError as exc:
            await context.abort(status_of(exc), exc.message)
        except grpc.aio.AbortError:
            raise
        except Exception:  # a bug must not leak a traceback text to the client (D12)
            log.exception("gRPC handler failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=decode if req_cls is None else deserializer(req_cls),
        response_serializer=encode if resp_cls is None else resp_cls.SerializeToString,
    )


def _repo_params(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is None:
            raise invalid_arg(f"parameter '{key}' has no value")
        if key == "config" and which != "string_param":
            raise invalid_arg("'config' parameter must be a string_param holding the JSON model config")
        if key.startswith("file:") and which != "bytes_param":
            raise invalid_arg(f"'{key}' parameter must be a bytes_param")
        out[key] = getattr(p, which)
    return out


def _setting_strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


class InferenceService:
    def __init__(self, dataplane: DataPlane, policy: Policy | None = None) -> None:
        self.dp = dataplane
        self.policy = policy if policy is not None else Policy()
        self.forward = self.policy.forward  # None: no metadata forwarding (the common case)
        self.stream = StreamInfer(dataplane, forward=self.forward)

    # ---- health and metadata ----
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dp.live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.dp.ready_async())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=await self.dp.model_ready_async(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        md = self.dp.server_metadata()
        return pb.ServerMetadataResponse(
            name=md.get("name", ""), version=md.get("version", ""), extensions=md.get("extensions", [])
        )

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        md = self.dp.model(request.name, request.version).metadata()
        resp = pb.ModelMetadataResponse(
            name=md.get("name", ""),
            versions=[str(v) for v in md.get("versions", [])],
            platform=md.get("platform", ""),
        )
        for src, dst in ((md.get("inputs", []), resp.inputs), (md.get("outputs", []), resp.outputs)):
            for t in src:
                dst.add(name=t["name"], datatype=t["datatype"], shape=[int(d) for d in t.get("shape", [])])
        return resp

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        cfg = self.dp.model(request.name, request.version).config()
        resp = pb.ModelConfigResponse()
        try:
            json_format.ParseDict(cfg, resp.config, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise InferdError(ErrorCode.INTERNAL, f"model configuration cannot be rendered: {exc}") from exc
        return resp

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        stats = await self.dp.model_statistics_async(request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # ---- inference ----
    async def ModelInfer(self, request: convert.ParsedRequest, context: Any) -> bytes:
        """Takes what `wire.decode_request` made of the bytes; answers serialized bytes."""
        future, shm_out = self.infer_start(request, context)
        # a client cancel cancels this task, and with it the awaiting infer (never swallowed)
        try:
            return wire.encode_response(await future, shm_out, self.dp)
        finally:
            if shm_out is not None and shm_out.hold is not None:
                shm_out.hold.release()  # its shm regions are free to unregister once its outputs are written

    def infer_start(self, request: convert.ParsedRequest | convert.BadRequest, context: Any = None) -> tuple[Any, Any]:
        """ModelInfer without a task: the data plane's future (cancelling it cancels the request).
        `context` gives the call's metadata (header forwarding)."""
        if request is BAD:
            raise invalid_arg(PARSE_ERROR)
        assert isinstance(request, convert.ParsedRequest)
        dp = self.dp
        handle = dp.model(request.model_name, request.model_version)  # the one lookup of this request's model
        if handle.decoupled:
            raise InferdError(ErrorCode.UNSUPPORTED, DECOUPLED_UNARY)
        req, shm_out = convert.to_core(request, dp)
        req.model = handle
        if self.forward is not None and context is not None:
            access.forward_grpc(self.forward, context.invocation_metadata() or (), req.parameters)
        if live.armed and context is not None:  # tracing: a client's W3C trace context is continued
            parent = access.first_value(context.invocation_metadata() or (), "traceparent")
            if parent:
                req.trace_parent = parent if isinstance(parent, str) else parent.decode("latin-1")
        return dp.infer_nowait(req), shm_out

    def infer_finish(self, resp: Any, shm_out: Any) -> tuple[list[Any], int]:
        """The ModelInferResponse of `infer_start`'s result, as byte pieces (outputs not copied)."""
        try:
            return wire.response_parts(resp, shm_out, self.dp)
        finally:
            if shm_out is not None and shm_out.hold is not None:
                shm_out.hold.release()

    # ---- repository ----
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        resp = pb.RepositoryIndexResponse()
        models = await self.dp.repository_index_async(request.ready)
        for m in models:
            resp.models.add(
                name=str(m.get("name", "")),
                version=str(m.get("version", "")),
                state=str(m.get("state", "")),
                reason=str(m.get("reason", "")),
            )
        return resp

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self.dp.load_model(request.model_name, _repo_params(request.parameters))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        params = _repo_params(request.parameters)
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid_arg("'unload_dependents' parameter must be a bool_param")
        await self.dp.unload_model(request.model_name, unload_dependents=dependents)
        return pb.RepositoryModelUnloadResponse()

    # ---- shared memory ----
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        resp = pb.SystemSharedMemoryStatusResponse()
        regions = await self.dp.shm_status_async("system", request.name)
        for r in regions:
            resp.regions[r["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r["name"],
                    key=r.get("key", ""),
                    offset=int(r.get("offset", 0)),
                    byte_size=int(r.get("byte_size", 0)),
                )
            )
        return resp

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        fields = {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        await self.dp.shm_register_async("system", request.name, **fields)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self.dp.shm_unregister_async("system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        resp = pb.CudaSharedMemoryStatusResponse()
        regions = await self.dp.shm_status_async("cuda", request.name)
        for r in regions:
            resp.regions[r["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=r["name"], device_id=int(r.get("device_id", 0)), byte_size=int(r.get("byte_size", 0))
                )
            )
        return resp

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        fields = {"raw_handle": request.raw_handle, "device_id": request.device_id, "byte_size": request.byte_size}
        await self.dp.shm_register_async("cuda", request.name, **fields)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self.dp.shm_unregister_async("cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- trace and log settings ----
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        # an empty value list clears the setting (HTTP's null); more than one value is an error for all but the level
        update = {k: list(v.value) or None for k, v in request.settings.items()} or None
        current = await self.dp.trace_settings_async(request.model_name, update)
        resp = pb.TraceSettingResponse()
        for k, v in current.items():
            resp.settings[k].value.extend(_setting_strings(v))
        return resp

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        update = {}
        for k, v in request.settings.items():
            which = v.WhichOneof("parameter_choice")
            if which is None:
                raise invalid_arg(f"log setting '{k}' has no value")
            update[k] = getattr(v, which)
        current = await self.dp.log_settings_async(update or None)
        resp = pb.LogSettingsResponse()
        for k, val in current.items():
            sv = resp.settings[k]
            if isinstance(val, bool):
                sv.bool_param = val
            elif isinstance(val, int) and 0 <= val < 2**32:
                sv.uint32_param = val
            else:
                sv.string_param = str(val)
        return resp

    # ---- grpc.health.v1 ----
    async def HealthCheck(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        status = health_pb2.HealthCheckResponse
        return status(status=status.SERVING if await self.dp.ready_async() else status.NOT_SERVING)

    # ---- registration ----
    def method_table(self) -> dict[str, tuple[Any, Any]]:
        """Unary RPC name -> (request class, response class), for the protobuf-coded methods."""
        return {
            "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
            "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
            "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
            "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
            "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
            "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
            "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
            "SystemSharedMemoryStatus": (pb.SystemSharedMemoryStatusRequest, pb.SystemSharedMemoryStatusResponse),
            "SystemSharedMemoryRegister": (
                pb.SystemSharedMemoryRegisterRequest,
                pb.SystemSharedMemoryRegisterResponse,
            ),
            "SystemSharedMemoryUnregister": (
                pb.SystemSharedMemoryUnregisterRequest,
                pb.SystemSharedMemoryUnregisterResponse,
            ),
            "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, pb.CudaSharedMemoryStatusResponse),
            "CudaSharedMemoryRegister": (pb.CudaSharedMemoryRegisterRequest, pb.CudaSharedMemoryRegisterResponse),
            "CudaSharedMemoryUnregister": (
                pb.CudaSharedMemoryUnregisterRequest,
                pb.CudaSharedMemoryUnregisterResponse,
            ),
            "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse),
            "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse),
        }

    def stream_handler(self) -> Callable[[Any, Any], AsyncIterator[Any]]:
        """ModelStreamInfer's handler; restricted, it first checks the stream's metadata."""
        handle = self.stream.handle
        rule = self.policy.rule("ModelStreamInfer")
        if rule is None:
            return handle

        async def guarded(request_iterator: Any, context: Any) -> AsyncIterator[Any]:
            if not allowed(rule, context.invocation_metadata(), "utf-8"):
                await context.abort(grpc.StatusCode.UNAVAILABLE, rule.message)
            async for message in handle(request_iterator, context):
                yield message

        return guarded

    def generic_handlers(self) -> list[grpc.GenericRpcHandler]:
        """The service for grpcio's server (`--grpc-server grpcio`)."""
        rule = self.policy.rule
        handlers: dict[str, grpc.RpcMethodHandler] = {
            name: _unary(getattr(self, name), req, resp, rule=rule(name))
            for name, (req, resp) in self.method_table().items()
        }
        # the hot path: hand-written wire codec, responses leave as bytes (wire.py)
        handlers["ModelInfer"] = _unary(self.ModelInfer, None, None, decode=wire.decode_request,
                                        rule=rule("ModelInfer"))
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.stream_handler(), request_deserializer=wire.decode_request, response_serializer=None
        )
        health = {"Check": _unary(self.HealthCheck, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse,
                                  rule=rule("Check"))}
        return [
            grpc.method_handlers_generic_handler(SERVICE, handlers),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, health),
        ]
