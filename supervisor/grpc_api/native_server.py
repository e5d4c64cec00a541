"""GRPCInferenceService and grpc.health.v1.Health on our own HTTP/2 server (grpc_api/http2).

grpc.aio costs ~0.3 ms of CPU per call on this class of machine before any of our code runs (its
core polls on a thread of its own and wakes the event loop per event); this server parses frames on
the event loop itself and answers ModelInfer from the data plane's done-callback, without a task.
The handlers are the same as for grpcio's server (servicer.py); `--grpc-server grpcio` keeps that one.

tritonserver's connection flags, as this server applies them:
- --grpc-use-ssl / --grpc-use-ssl-mutual: TLS 1.2+ with ALPN "h2" (tls.py), client certificates
  verified against --grpc-root-cert when mutual.
- --reuse-grpc-port: SO_REUSEPORT, so several servers share the port (the kernel spreads connections).
- --grpc-keepalive-time / --grpc-keepalive-timeout / --grpc-keepalive-permit-without-calls: a client
  that sent nothing for the keepalive time gets a PING (only while it has calls running, unless
  permit-without-calls); no ACK within the timeout and the connection is dropped.
- --grpc-max-connection-age / --grpc-max-connection-age-grace: at that age (±10 %) the connection gets
  GOAWAY, so the client opens a new one for new calls; running calls get the grace period (0: as long
  as they take), then the connection is closed.
- --grpc-http2-max-ping-strikes / --grpc-http2-min-recv-ping-interval-without-data /
  --grpc-keepalive-permit-without-calls police the client's PINGs as grpc-core does (http2/abuse.py):
  a PING sooner than the minimum interval after the last one (2 hours while no call runs, unless
  permitted without calls) is a strike; one strike over the maximum and the connection gets
  GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings"). --grpc-http2-max-pings-without-data limits a sender's
  own PINGs; this server sends only keepalive PINGs, one per quiet keepalive interval.

Every connection also has the flood limits of http2/abuse.py (rapid reset, glitches, unread ACKs,
CONTINUATION and WINDOW_UPDATE floods).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from inferd.supervisor._gen import health_pb2
from inferd.worker.wire.errors import InferdError

from ..config import GrpcKeepalive
from ..core.dataplane import DataPlane
from . import wire
from .convert import BAD, PARSE_ERROR, deserializer
from .errors import status_of
from .http2.abuse import PingPolicy
from .http2.connection import H2Connection
from .http2.grpc_calls import Call, Context, Method, StreamCall, UnaryCall
from .http2.grpc_wire import (
    INVALID_ARGUMENT,
    MAX_MESSAGE_LIMIT,
    UNAVAILABLE,
    UNIMPLEMENTED,
    Abort,
    parse_timeout,
    trailers_only,
)
from .http2.hpack_codec import HeaderList, encode
from .http2.lifetime import Lifetime
from .servicer import HEALTH_SERVICE, SERVICE, InferenceService, Policy, allowed

log = logging.getLogger("inferd.grpc")

_ENCODINGS = (None, "identity", "gzip", "deflate")


def _errors(exc: BaseException) -> tuple[int, str] | None:
    if isinstance(exc, InferdError):
        return int(status_of(exc).value[0]), exc.message
    return None


def _checked(fn: Any) -> Any:
    async def handle(request: Any, context: Any) -> Any:
        if request is BAD:
            raise Abort(INVALID_ARGUMENT, PARSE_ERROR)
        return await fn(request, context)

    return handle


def build_methods(service: InferenceService) -> dict[str, Method]:
    """':path' -> Method for every RPC we serve; each carries the service policy's rule for it
    (--grpc-restricted-protocol), which open_stream checks before the call starts."""
    rule = service.policy.rule
    methods: dict[str, Method] = {}
    for name, (req_cls, resp_cls) in service.method_table().items():
        methods[f"/{SERVICE}/{name}"] = Method(
            False, _checked(getattr(service, name)), deserializer(req_cls), resp_cls.SerializeToString, errors=_errors,
            rule=rule(name),
        )
    methods[f"/{SERVICE}/ModelInfer"] = Method(
        False,
        _checked(service.ModelInfer),
        wire.decode_request,
        start=service.infer_start,
        finish=service.infer_finish,
        errors=_errors,
        rule=rule("ModelInfer"),
    )
    methods[f"/{SERVICE}/ModelStreamInfer"] = Method(
        True, service.stream.handle, wire.decode_request, errors=_errors, rule=rule("ModelStreamInfer")
    )
    methods[f"/{HEALTH_SERVICE}/Check"] = Method(
        False,
        _checked(service.HealthCheck),
        deserializer(health_pb2.HealthCheckRequest),
        health_pb2.HealthCheckResponse.SerializeToString,
        errors=_errors,
        rule=rule("Check"),
    )
    return methods


_STATUS_405 = encode([(":status", "405")])
_STATUS_415 = encode([(":status", "415")])


def lifetime(keepalive: GrpcKeepalive) -> Lifetime:
    """tritonserver's keepalive and connection-age settings (milliseconds, 0 = off / no limit) as the
    HTTP/2 connection applies them (seconds, None = off / no limit)."""
    age, grace = keepalive.max_connection_age_ms, keepalive.max_connection_age_grace_ms
    return Lifetime(
        ping_interval=keepalive.time_ms / 1000 if keepalive.time_ms > 0 else None,
        ping_timeout=max(keepalive.timeout_ms, 1) / 1000,
        ping_idle=keepalive.permit_without_calls,
        max_age=age / 1000 if age > 0 else None,
        max_age_grace=grace / 1000 if grace > 0 else None,
    )


def ping_policy(keepalive: GrpcKeepalive) -> PingPolicy:
    """tritonserver's PING policing flags (milliseconds) as the HTTP/2 connection applies them."""
    return PingPolicy(
        max_strikes=max(0, keepalive.max_ping_strikes),
        min_interval=max(0, keepalive.min_recv_ping_interval_without_data_ms) / 1000,
        permit_without_calls=keepalive.permit_without_calls,
    )


RequestHead = tuple[str | None, str | None, str | None, str | None, str | None, Context]


def _request_head(headers: list[tuple[str, str]]) -> RequestHead:
    """(:path, :method, content-type, grpc-timeout, grpc-encoding, a Context with the rest as the call's
    metadata; read only, it serves every call of these headers)."""
    path = verb = ctype = timeout = encoding = None
    metadata: list[tuple[str, str]] = []
    for key, value in headers:
        if key[:1] == ":":  # not key[0]: a client may send an empty name (it becomes metadata)
            if key == ":path":
                path = value
            elif key == ":method":
                verb = value
        elif key == "content-type":
            ctype = value
        elif key == "grpc-timeout":
            timeout = value
        elif key == "grpc-encoding":
            encoding = value
        else:
            metadata.append((key, value))
    return path, verb, ctype, timeout, encoding, Context(tuple(metadata))


class NativeGrpcServer:
    """Listens, owns the connections and tracks the calls so that `stop` can drain them."""

    def __init__(
        self, methods: dict[str, Method], max_message_bytes: int = MAX_MESSAGE_LIMIT, lifetime: Lifetime | None = None,
        pings: PingPolicy | None = None,
    ) -> None:
        self.methods = methods
        self.max_message_bytes = max_message_bytes
        self.lifetime = lifetime
        self.pings = pings or PingPolicy()  # grpc-core's defaults
        self.calls: set[Call] = set()
        self.connections: set[H2Connection] = set()
        self.stopping = False
        self._server: asyncio.base_events.Server | None = None
        self.idle: asyncio.Event | None = None  # stop waits on it; the last call to end sets it (Call._finished)
        self.port = 0

    # ---- the HTTP/2 connection's App interface ----
    def connection_made(self, conn: H2Connection) -> None:
        self.connections.add(conn)
        if self.stopping:
            conn.goaway()

    def connection_lost(self, conn: H2Connection) -> None:
        self.connections.discard(conn)

    def open_stream(
        self, conn: H2Connection, stream_id: int, headers: list[tuple[str, str]], end_stream: bool
    ) -> Call | None:
        sid = stream_id
        head = getattr(headers, "memo", None)  # a block seen before on this connection: read once (hpack_codec)
        if head is None:
            head = _request_head(headers)
            if isinstance(headers, HeaderList):
                headers.memo = head
        path, verb, ctype, timeout, encoding, context = head
        if verb != "POST":
            conn.send_headers(sid, _STATUS_405, end_stream=True)
            return None
        if ctype is None or not ctype.startswith("application/grpc"):
            conn.send_headers(sid, _STATUS_415, end_stream=True)
            return None
        method = self.methods.get(path or "")
        if method is None:
            return self._refuse(conn, sid, UNIMPLEMENTED, f"Method not found: {path}")
        if encoding not in _ENCODINGS:
            return self._refuse(conn, sid, UNIMPLEMENTED, f"Compression algorithm '{encoding}' is not supported")
        if self.stopping:
            return self._refuse(conn, sid, UNAVAILABLE, "the server is shutting down")
        if method.rule is not None and not allowed(method.rule, context.metadata):  # --grpc-restricted-protocol
            return self._refuse(conn, sid, UNAVAILABLE, method.rule.message)
        seconds = parse_timeout(timeout) if timeout is not None else None
        kind = StreamCall if method.streaming else UnaryCall
        return kind(self, conn, sid, method, context, seconds, encoding)

    @staticmethod
    def _refuse(conn: H2Connection, sid: int, code: int, message: str) -> None:
        conn.send_headers(sid, trailers_only(code, message), end_stream=True)
        return None

    # ---- lifecycle ----
    async def start(
        self, address: str, port: int, tls: ssl.SSLContext | None = None, reuse_port: bool = False
    ) -> int:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        lifetime, pings = self.lifetime, self.pings
        self._server = await loop.create_server(
            lambda: H2Connection(self, lifetime, pings),
            address,
            port,
            family=family,
            reuse_address=True,
            reuse_port=reuse_port,
            backlog=1024,
            ssl=tls,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        for sock in self._server.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.port

    async def stop(self, grace: float) -> None:
        """Refuse new calls (GOAWAY), give running ones `grace` seconds, then cancel them."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.goaway()
        if self.calls:
            self.idle = asyncio.Event()
            try:
                await asyncio.wait_for(self.idle.wait(), grace)
            except asyncio.TimeoutError:
                log.warning("%d gRPC calls still running after %.1f s: cancelling them", len(self.calls), grace)
        for call in list(self.calls):
            call.on_reset()
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()


async def start_native_server(
    dataplane: DataPlane,
    address: str,
    port: int,
    max_message_bytes: int = MAX_MESSAGE_LIMIT,
    *,
    tls: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    keepalive: GrpcKeepalive | None = None,
    policy: Policy | None = None,
) -> NativeGrpcServer:
    """Bind and serve; `tls` (tls.server_context) for TLS, `reuse_port` for SO_REUSEPORT, `keepalive`
    for keepalive PINGs and the maximum connection age, `policy` for restricted calls and forwarded metadata."""
    conn_lifetime = lifetime(keepalive) if keepalive is not None else None
    pings = ping_policy(keepalive) if keepalive is not None else None
    server = NativeGrpcServer(build_methods(InferenceService(dataplane, policy)), max_message_bytes, conn_lifetime,
                              pings)
    try:
        await server.start(address, port, tls, reuse_port)
    except OSError as exc:
        raise OSError(f"gRPC server cannot bind {address}:{port}: {exc}") from exc
    log.info("Started GRPCInferenceService at %s:%d", address, server.port)
    return server
