"""Starting and stopping the grpc.aio server that carries GRPCInferenceService and Health.

tritonserver's --grpc-use-ssl(-mutual), --reuse-grpc-port, --grpc-keepalive-*, --grpc-http2-* and
--grpc-max-connection-age(-grace) become grpcio's server credentials and channel arguments, as
tritonserver passes them to its own gRPC core.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ..config import GrpcKeepalive
from ..core.dataplane import DataPlane
from .http2.grpc_wire import MAX_MESSAGE_LIMIT
from .servicer import InferenceService, Policy

log = logging.getLogger("inferd.grpc")

MAX_CONCURRENT_STREAMS = 4096  # HTTP/2 streams per connection: many clients share few connections


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address and not address.startswith("[") else f"{address}:{port}"


def channel_options(
    max_message_bytes: int, reuse_port: bool = False, keepalive: GrpcKeepalive | None = None
) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        # grpcio's default is 1: a second server on the same port would start silently and take half
        # the calls; only --reuse-grpc-port asks for that
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    if keepalive is not None:
        options += [
            ("grpc.keepalive_time_ms", keepalive.time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", keepalive.max_pings_without_data),
            ("grpc.http2.min_ping_interval_without_data_ms", keepalive.min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", keepalive.max_ping_strikes),
        ]
        # 0 means no limit (tritonserver's default); grpc's own defaults are "no limit" too
        if keepalive.max_connection_age_ms > 0:
            options.append(("grpc.max_connection_age_ms", keepalive.max_connection_age_ms))
        if keepalive.max_connection_age_grace_ms > 0:
            options.append(("grpc.max_connection_age_grace_ms", keepalive.max_connection_age_grace_ms))
    return options


async def start_grpc_server(
    dataplane: DataPlane,
    address: str,
    port: int,
    max_message_bytes: int = MAX_MESSAGE_LIMIT,
    *,
    credentials: grpc.ServerCredentials | None = None,
    reuse_port: bool = False,
    keepalive: GrpcKeepalive | None = None,
    policy: Policy | None = None,
) -> grpc.aio.Server:
    """Bind, start and return the server; `server.inferd_port` holds the bound port (for port 0).
    `credentials` (tls.server_credentials) serve TLS; `policy` applies restricted calls and forwarded metadata.

    Stop it with `await server.stop(grace_seconds)`: new RPCs are refused at once, running ones get
    `grace_seconds` to finish and are then cancelled (which cancels their data-plane requests).
    """
    server = grpc.aio.server(options=channel_options(max_message_bytes, reuse_port, keepalive))
    server.add_generic_rpc_handlers(InferenceService(dataplane, policy).generic_handlers())
    target = _host_port(address, port)
    try:
        if credentials is not None:
            bound = server.add_secure_port(target, credentials)
        else:
            bound = server.add_insecure_port(target)
    except RuntimeError as exc:  # grpcio raises on bind failure (older versions returned 0)
        raise OSError(f"gRPC server cannot bind {target}: {exc}") from exc
    if bound == 0:
        raise OSError(f"gRPC server cannot bind {target}")
    await server.start()
    server.inferd_port = bound  # type: ignore[attr-defined]
    log.info("Started GRPCInferenceService at %s", _host_port(address, bound))
    return server
