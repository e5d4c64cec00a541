"""The gRPC frontend as the app starts it: `await start(dataplane, config)`, then `await stop()`."""

from __future__ import annotations

from typing import Any

from ..core.dataplane import DataPlane


class GrpcFrontend:
    def __init__(self, server: Any, port: int, grace_s: float) -> None:
        self.server = server  # NativeGrpcServer or grpc.aio.Server: both stop(grace)
        self.port = port
        self.grace_s = grace_s

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new RPCs, give running ones `grace` seconds, then cancel them."""
        await self.server.stop(self.grace_s if grace is None else grace)


async def start(dataplane: DataPlane, config: Any) -> GrpcFrontend:
    """`config` is the ServerConfig: grpc_address, grpc_port, grpc_server, exit_timeout_secs are read."""
    grace = float(getattr(config, "exit_timeout_secs", 30.0))
    if getattr(config, "grpc_server", "native") == "grpcio":
        from .server import start_grpc_server

        server = await start_grpc_server(dataplane, config.grpc_address, config.grpc_port)
        return GrpcFrontend(server, server.inferd_port, grace)  # type: ignore[attr-defined]
    from .native import start_native_server

    native = await start_native_server(dataplane, config.grpc_address, config.grpc_port)
    return GrpcFrontend(native, native.port, grace)
