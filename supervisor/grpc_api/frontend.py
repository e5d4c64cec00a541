"""The gRPC frontend as the app starts it: `await start(dataplane, config)`, then `await stop()`."""

from __future__ import annotations

from typing import Any

import grpc

from ..core.dataplane import DataPlane
from .server import start_grpc_server


class GrpcFrontend:
    def __init__(self, server: grpc.aio.Server, port: int, grace_s: float) -> None:
        self.server = server
        self.port = port
        self.grace_s = grace_s

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new RPCs, give running ones `grace` seconds, then cancel them."""
        await self.server.stop(self.grace_s if grace is None else grace)


async def start(dataplane: DataPlane, config: Any) -> GrpcFrontend:
    """`config` is the ServerConfig: grpc_address, grpc_port, exit_timeout_secs are read."""
    server = await start_grpc_server(dataplane, config.grpc_address, config.grpc_port)
    grace = float(getattr(config, "exit_timeout_secs", 30.0))
    return GrpcFrontend(server, server.inferd_port, grace)  # type: ignore[attr-defined]
