"""The HTTP and metrics frontends as the app starts them: `await start(dataplane, config)`, `await stop()`.

Reads from the ServerConfig: http_address, http_port, http_max_input_size, metrics_address,
metrics_port, exit_timeout_secs, reuse_http_port, http_restricted (category -> (header, value), from
--http-restricted-api), http_header_forward_pattern; and, when the config grows them,
http_header_timeout_s, http_body_timeout_s, http_keepalive_timeout_s. The metrics port is never
restricted (nor is Triton's).
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.dataplane import DataPlane
from . import routes
from .codec import Limits
from .metrics import start_metrics_server
from .server import HttpServer, start_http_server

log = logging.getLogger("inferd.http")


class HttpFrontend:
    def __init__(self, server: HttpServer, grace_s: float) -> None:
        self.server = server
        self.port = server.port
        self.grace_s = grace_s

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, close idle connections, let running requests finish for `grace` seconds."""
        self.server.close()
        await self.server.wait_closed(self.grace_s if grace is None else grace)


async def start(dataplane: DataPlane, config: Any) -> HttpFrontend:
    limits = Limits(max_input_size=int(config.http_max_input_size))
    forward = str(getattr(config, "http_header_forward_pattern", "") or "")
    router = routes.Router(dataplane, limits=limits, restricted=dict(getattr(config, "http_restricted", None) or {}),
                           header_forward_pattern=forward)
    server = await start_http_server(
        router, config.http_address, config.http_port, max_body=limits.max_input_size,
        header_timeout=float(getattr(config, "http_header_timeout_s", 30.0)),
        body_timeout=float(getattr(config, "http_body_timeout_s", 30.0)),
        keepalive_timeout=float(getattr(config, "http_keepalive_timeout_s", 75.0)),
        reuse_port=bool(getattr(config, "reuse_http_port", False)),
        keep_header_case=bool(forward),  # Triton forwards header names as the client spelled them
        max_connections=int(getattr(config, "http_max_connections", 8192)),
        max_pipelined=int(getattr(config, "http_max_pipelined_requests", 32)),
    )
    log.info("Started HTTPService at %s:%d", config.http_address, server.port)
    return HttpFrontend(server, float(getattr(config, "exit_timeout_secs", 30.0)))


async def start_metrics(dataplane: DataPlane, config: Any) -> HttpFrontend:
    server = await start_metrics_server(dataplane, config.metrics_address, config.metrics_port)
    log.info("Started Metrics Service at %s:%d", config.metrics_address, server.port)
    return HttpFrontend(server, 1.0)
