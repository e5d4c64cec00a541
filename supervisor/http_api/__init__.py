"""HTTP/REST frontend (KServe v2 + Triton extensions) and the metrics endpoint.

The app starts them through frontend.py (both paths below build the router and server in one place,
`start_http_api`):

    http = await frontend.start(dataplane, config)            # HttpFrontend, .port
    metrics = await frontend.start_metrics(dataplane, config)
    ...
    await http.stop()      # stop accepting, close idle keep-alive connections, let running
    await metrics.stop()   # requests finish (up to exit_timeout_secs), abort the rest

Lower level: `start_http_api(dataplane, host, port, ...)` / `start_metrics_server(...)` return an
HttpServer (`.port`, `.close()`, `await .wait_closed(timeout)`).
"""

from __future__ import annotations

from .codec import Limits
from .frontend import start_http_api
from .metrics_server import start_metrics_server
from .routes import Router
from .server import HttpServer, Request, Response, start_http_server

__all__ = ["HttpServer", "Limits", "Request", "Response", "Router", "start_http_api", "start_http_server",
           "start_metrics_server"]
