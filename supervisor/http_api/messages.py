"""Request and Response objects handed between the HTTP connection and the handler."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Union


class Request:
    """One parsed request. Header names are lower-cased; `body` is bytes-like. `raw_headers` holds every
    header as received (names as the client spelled them, repeats included) when the server keeps them
    (HttpServer keep_header_case, for --http-header-forward-pattern), else None."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "raw_headers")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: Any,
                 keep_alive: bool, raw_headers: list[tuple[str, str]] | None = None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.raw_headers = raw_headers


class Response:
    """Status, body (bytes, or a sequence of buffers written without joining) and headers."""

    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int = 200, body: bytes | Sequence[Any] = b"",
                 content_type: str | None = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class Deferred:
    """A response that `finish(context, future)` builds once `future` is done. The connection waits for it
    with a done-callback instead of running a task per request (cheaper); cancelling `future` abandons it."""

    __slots__ = ("future", "finish", "context")

    def __init__(self, future: asyncio.Future[Any], finish: Callable[[Any, asyncio.Future[Any]], Response],
                 context: Any = None) -> None:
        self.future = future
        self.finish = finish
        self.context = context


HandlerResult = Union[Response, Deferred, Awaitable[Response]]
Handler = Callable[[Request], HandlerResult]
