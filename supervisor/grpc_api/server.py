"""Starting and stopping the grpc.aio server that carries GRPCInferenceService and Health."""

from __future__ import annotations

import logging

import grpc

from ..core.dataplane import DataPlane
from .http2.grpc_wire import MAX_MESSAGE_LIMIT
from .servicer import InferenceService

log = logging.getLogger("inferd.grpc")

MAX_CONCURRENT_STREAMS = 4096  # HTTP/2 streams per connection: many clients share few connections


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address and not address.startswith("[") else f"{address}:{port}"


async def start_grpc_server(
    dataplane: DataPlane, address: str, port: int, max_message_bytes: int = MAX_MESSAGE_LIMIT
) -> grpc.aio.Server:
    """Bind, start and return the server; `server.inferd_port` holds the bound port (for port 0).

    Stop it with `await server.stop(grace_seconds)`: new RPCs are refused at once, running ones get
    `grace_seconds` to finish and are then cancelled (which cancels their data-plane requests).
    """
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        # without this a second server on the same port starts silently and steals half the calls
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers(InferenceService(dataplane).generic_handlers())
    target = _host_port(address, port)
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:  # grpcio raises on bind failure (older versions returned 0)
        raise OSError(f"gRPC server cannot bind {target}: {exc}") from exc
    if bound == 0:
        raise OSError(f"gRPC server cannot bind {target}")
    await server.start()
    server.inferd_port = bound  # type: ignore[attr-defined]
    log.info("Started GRPCInferenceService at %s", _host_port(address, bound))
    return server
