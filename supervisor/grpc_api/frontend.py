"""The gRPC frontend as the app starts it: `await start(dataplane, config)`, then `await stop()`."""

from __future__ import annotations

import logging
from typing import Any

from ..core.dataplane import DataPlane
from . import tls
from .http2.grpc_wire import MAX_MESSAGE_LIMIT
from .servicer import Policy

log = logging.getLogger("inferd.grpc")


class GrpcFrontend:
    def __init__(self, server: Any, port: int, grace_s: float) -> None:
        self.server = server  # NativeGrpcServer or grpc.aio.Server: both stop(grace)
        self.port = port
        self.grace_s = grace_s

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new RPCs, give running ones `grace` seconds, then cancel them."""
        await self.server.stop(self.grace_s if grace is None else grace)


def max_message_size(config: Any) -> int:
    """--grpc-max-message-size, or the HTTP body cap plus 1 MiB of protobuf around the tensors."""
    size = int(getattr(config, "grpc_max_message_size", 0) or 0)
    if size <= 0:
        size = int(getattr(config, "http_max_input_size", 64 * 1024 * 1024)) + 1024 * 1024
    return min(size, MAX_MESSAGE_LIMIT)


async def start(dataplane: DataPlane, config: Any) -> GrpcFrontend:
    """`config` is the ServerConfig: grpc_address, grpc_port, grpc_server, grpc_max_message_size,
    http_max_input_size, exit_timeout_secs, reuse_grpc_port, grpc_keepalive, the TLS settings
    (grpc_use_ssl, grpc_use_ssl_mutual, grpc_server_cert, grpc_server_key, grpc_root_cert), and
    grpc_restricted and grpc_header_forward_pattern (servicer.Policy) are read."""
    policy = Policy.of(config)
    grace = float(getattr(config, "exit_timeout_secs", 30.0))
    limit = max_message_size(config)
    reuse_port = bool(getattr(config, "reuse_grpc_port", False))
    keepalive = getattr(config, "grpc_keepalive", None)
    frontend: GrpcFrontend
    if getattr(config, "grpc_server", "native") == "grpcio":
        from .grpcio_server import start_grpc_server

        server = await start_grpc_server(
            dataplane, config.grpc_address, config.grpc_port, limit,
            credentials=tls.server_credentials(config), reuse_port=reuse_port, keepalive=keepalive, policy=policy,
        )
        frontend = GrpcFrontend(server, server.inferd_port, grace)  # type: ignore[attr-defined]
    else:
        from .native_server import start_native_server

        native = await start_native_server(
            dataplane, config.grpc_address, config.grpc_port, limit,
            tls=tls.server_context(config), reuse_port=reuse_port, keepalive=keepalive, policy=policy,
        )
        frontend = GrpcFrontend(native, native.port, grace)
    if tls.enabled(config):
        log.info("gRPC serves %s", tls.describe(config))
    return frontend
