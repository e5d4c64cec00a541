"""The metrics port (--metrics-port): `GET /metrics`, the body metrics/endpoint.py renders (DataPlane.metrics_text)."""

from __future__ import annotations

from collections.abc import Awaitable

from inferd.supervisor.core.dataplane import DataPlane
from inferd.supervisor.metrics.text_format import CONTENT_TYPE

from . import errors
from .server import HttpServer, Request, Response, start_http_server


class MetricsHandler:
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    def __call__(self, req: Request) -> Response | Awaitable[Response]:
        if req.path != "/metrics":
            return errors.NOT_FOUND
        if req.method != "GET":
            return errors.METHOD_NOT_ALLOWED
        return self._render()

    async def _render(self) -> Response:
        try:  # awaited: with frontend processes, their latest figures are asked for first
            return Response(200, await self.dp.metrics_text_async(), CONTENT_TYPE)
        except Exception as exc:
            return errors.from_exception(exc)


async def start_metrics_server(dataplane: DataPlane, host: str, port: int, *,
                               keepalive_timeout: float = 75.0) -> HttpServer:
    """Serve GET /metrics on host:port. Stop with `server.close()` + `await server.wait_closed(t)`."""
    return await start_http_server(MetricsHandler(dataplane), host, port, max_body=64 * 1024,
                                   keepalive_timeout=keepalive_timeout)
