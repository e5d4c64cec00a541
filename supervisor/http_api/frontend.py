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
from .metrics_server import start_metrics_server
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


async def start_http_api(dataplane: DataPlane, host: str, port: int, *,
                         max_input_size: int = 64 * 1024 * 1024,
                         header_timeout: float = 30.0, body_timeout: float = 30.0,
                         keepalive_timeout: float = 75.0, max_header_size: int = 16384,
                         restricted: dict[str, tuple[str, str]] | None = None,
                         header_forward_pattern: str = "",
                         limits: Limits | None = None, max_connections: int = 8192,
                         max_pipelined: int = 32, reuse_port: bool = False) -> HttpServer:
    """Listen on host:port (0 = a free port, read `.port`) and serve the KServe v2 API.

    `restricted`: category ("health", "metadata", "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "trace", "logging") -> (header, value), as parsed from
    --http-restricted-api; requests of that category without the header get 403.
    `header_forward_pattern`: --http-header-forward-pattern (matching headers become parameters of
    inference requests).
    """
    limits = limits or Limits(max_input_size=max_input_size)
    router = routes.Router(dataplane, limits=limits, restricted=restricted,
                           header_forward_pattern=header_forward_pattern)
    return await start_http_server(router, host, port, max_body=limits.max_input_size,
                                   max_header_size=max_header_size, header_timeout=header_timeout,
                                   body_timeout=body_timeout, keepalive_timeout=keepalive_timeout,
                                   reuse_port=reuse_port,
                                   keep_header_case=bool(header_forward_pattern),  # Triton forwards names as spelled
                                   max_connections=max_connections, max_pipelined=max_pipelined)


async def start(dataplane: DataPlane, config: Any) -> HttpFrontend:
    server = await start_http_api(
        dataplane, config.http_address, config.http_port,
        limits=Limits(max_input_size=int(config.http_max_input_size)),
        restricted=dict(getattr(config, "http_restricted", None) or {}),
        header_forward_pattern=str(getattr(config, "http_header_forward_pattern", "") or ""),
        header_timeout=float(getattr(config, "http_header_timeout_s", 30.0)),
        body_timeout=float(getattr(config, "http_body_timeout_s", 30.0)),
        keepalive_timeout=float(getattr(config, "http_keepalive_timeout_s", 75.0)),
        reuse_port=bool(getattr(config, "reuse_http_port", False)),
        max_connections=int(getattr(config, "http_max_connections", 8192)),
        max_pipelined=int(getattr(config, "http_max_pipelined_requests", 32)),
    )
    log.info("Started HTTPService at %s:%d", config.http_address, server.port)
    return HttpFrontend(server, float(getattr(config, "exit_timeout_secs", 30.0)))


async def start_metrics(dataplane: DataPlane, config: Any) -> HttpFrontend:
    server = await start_metrics_server(dataplane, config.metrics_address, config.metrics_port)
    log.info("Started Metrics Service at %s:%d", config.metrics_address, server.port)
    return HttpFrontend(server, 1.0)
