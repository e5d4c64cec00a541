"""The HTTP and metrics frontends as the app starts them: `await start(dataplane, config)`, `await stop()`.

Reads from the ServerConfig: http_address, http_port, http_max_input_size, metrics_address,
metrics_port, exit_timeout_secs; and, when the config grows them, http_restricted_api (a sequence
of Triton-style `<api>[,<api>...]:<header>=<value>` specs), http_header_timeout_s,
http_body_timeout_s, http_keepalive_timeout_s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..core.dataplane import DataPlane
from . import routes
from .codec import Limits
from .metrics import start_metrics_server
from .server import HttpServer, start_http_server

CATEGORIES = frozenset({routes.HEALTH, routes.METADATA, routes.INFERENCE, routes.SHARED_MEMORY,
                        routes.MODEL_CONFIG, routes.MODEL_REPOSITORY, routes.STATISTICS, routes.TRACE,
                        routes.LOGGING})

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


def parse_restricted(specs: Iterable[str]) -> dict[str, tuple[str, str]]:
    """`--http-restricted-api` values into {category: (header, value)}; ValueError when malformed."""
    out: dict[str, tuple[str, str]] = {}
    for spec in specs:
        apis, sep, rule = spec.partition(":")
        header, eq, value = rule.partition("=")
        if not sep or not eq or not header.strip() or not apis.strip():
            raise ValueError(f"invalid --http-restricted-api value {spec!r}: expected <api>,...:<header>=<value>")
        for api in apis.split(","):
            api = api.strip()
            if api not in CATEGORIES:
                raise ValueError(f"unknown restricted API category '{api}'")
            if api in out:
                raise ValueError(f"restricted API category '{api}' is given more than once")
            out[api] = (header.strip(), value)
    return out


async def start(dataplane: DataPlane, config: Any) -> HttpFrontend:
    limits = Limits(max_input_size=int(config.http_max_input_size))
    router = routes.Router(dataplane, limits=limits,
                           restricted=parse_restricted(getattr(config, "http_restricted_api", ()) or ()))
    server = await start_http_server(
        router, config.http_address, config.http_port, max_body=limits.max_input_size,
        header_timeout=float(getattr(config, "http_header_timeout_s", 30.0)),
        body_timeout=float(getattr(config, "http_body_timeout_s", 30.0)),
        keepalive_timeout=float(getattr(config, "http_keepalive_timeout_s", 75.0)),
        reuse_port=bool(getattr(config, "reuse_http_port", False)),
    )
    log.info("Started HTTPService at %s:%d", config.http_address, server.port)
    return HttpFrontend(server, float(getattr(config, "exit_timeout_secs", 30.0)))


async def start_metrics(dataplane: DataPlane, config: Any) -> HttpFrontend:
    server = await start_metrics_server(dataplane, config.metrics_address, config.metrics_port)
    log.info("Started Metrics Service at %s:%d", config.metrics_address, server.port)
    return HttpFrontend(server, 1.0)
