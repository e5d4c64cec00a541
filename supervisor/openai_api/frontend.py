"""The OpenAI API as the app starts it: `await start(dataplane, config)` -> a frontend with `.port` and
`await .stop()`, listening on --openai-address:--openai-port with http_api's HTTP/1.1 server (the same
body cap, timeouts and connection limits as the KServe HTTP port) and this package's router. It runs in
the supervisor's own process over its data plane, with --frontend-processes too (docs/openai.md)."""

from __future__ import annotations

import logging
from typing import Any

from inferd.supervisor.core.dataplane import InProcessDataPlane
from inferd.supervisor.http_api.frontend import HttpFrontend
from inferd.supervisor.http_api.server import HttpServer

from .catalog import Catalog
from .connection import OpenAIConnection
from .context import Api
from .routes import Router

log = logging.getLogger("inferd.openai")


def build_api(dataplane: InProcessDataPlane, config: Any) -> Api:
    options = config.openai
    template = None
    if options.chat_template:
        with open(options.chat_template, encoding="utf-8") as f:
            template = f.read()
    catalog = Catalog(dataplane, tuple(config.model_repositories), tokenizer=options.tokenizer,
                      backend=options.backend)
    return Api(dataplane, catalog, options, template, config.model_control_mode)


async def start(dataplane: InProcessDataPlane, config: Any) -> HttpFrontend:
    options = config.openai
    api = build_api(dataplane, config)
    server = HttpServer(Router(api), max_body=int(config.http_max_input_size),
                        header_timeout=float(getattr(config, "http_header_timeout_s", 30.0)),
                        body_timeout=float(getattr(config, "http_body_timeout_s", 30.0)),
                        keepalive_timeout=float(getattr(config, "http_keepalive_timeout_s", 75.0)),
                        max_connections=int(config.http_max_connections),
                        max_pipelined=int(config.http_max_pipelined_requests))
    server.connection_class = OpenAIConnection
    await server.start(options.address, options.port)
    if options.restricted:  # header names only: the values are secrets
        log.info("OpenAI API restrictions: %s", {g: key for g, (key, _) in options.restricted.items()})
    log.info("Started OpenAI API at %s:%d", options.address, server.port)
    return HttpFrontend(server, float(getattr(config, "exit_timeout_secs", 30.0)))
