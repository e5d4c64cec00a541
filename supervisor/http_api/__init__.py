"""HTTP/REST frontend (KServe v2 + Triton extensions) and the metrics endpoint.

The app starts them through frontend.py:

    http = await frontend.start(dataplane, config)            # HttpFrontend, .port
    metrics = await frontend.start_metrics(dataplane, config)
    ...
    await http.stop()      # stop accepting, close idle keep-alive connections, let running
    await metrics.stop()   # requests finish (up to exit_timeout_secs), abort the rest

Lower level: `start_http_api(dataplane, host, port, ...)` / `start_metrics_server(...)` return an
HttpServer (`.port`, `.close()`, `await .wait_closed(timeout)`).
"""

from __future__ import annotations

from inferd.supervisor.core.dataplane import DataPlane

from .codec import Limits
from .metrics import start_metrics_server
from .routes import Router
from .server import HttpServer, Request, Response, start_http_server

__all__ = ["HttpServer", "Limits", "Request", "Response", "Router", "start_http_api", "start_http_server",
           "start_metrics_server"]


async def start_http_api(dataplane: DataPlane, host: str, port: int, *,
                         max_input_size: int = 64 * 1024 * 1024,
                         header_timeout: float = 30.0, body_timeout: float = 30.0,
                         keepalive_timeout: float = 75.0, max_header_size: int = 16384,
                         restricted: dict[str, tuple[str, str]] | None = None,
                         header_forward_pattern: str = "",
                         limits: Limits | None = None, max_connections: int = 8192,
                         max_pipelined: int = 32) -> HttpServer:
    """Listen on host:port (0 = a free port, read `.port`) and serve the KServe v2 API.

    `restricted`: category ("health", "metadata", "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "trace", "logging") -> (header, value), as parsed from
    --http-restricted-api; requests of that category without the header get 403.
    `header_forward_pattern`: --http-header-forward-pattern (matching headers become parameters of
    inference requests).
    """
    limits = limits or Limits(max_input_size=max_input_size)
    router = Router(dataplane, limits=limits, restricted=restricted, header_forward_pattern=header_forward_pattern)
    return await start_http_server(router, host, port, max_body=limits.max_input_size,
                                   max_header_size=max_header_size, header_timeout=header_timeout,
                                   body_timeout=body_timeout, keepalive_timeout=keepalive_timeout,
                                   keep_header_case=bool(header_forward_pattern),
                                   max_connections=max_connections, max_pipelined=max_pipelined)
