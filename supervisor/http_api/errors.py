"""The one table from protocol-neutral error codes to HTTP statuses, and the error body.

Triton's HttpCodeFromError plus our RESOURCE_EXHAUSTED (size caps) as 413. The data plane reports a
full /dev/shm as UNAVAILABLE, so it answers 503 through the same table.
"""

from __future__ import annotations

import logging

import orjson
from inferd.worker.wire.errors import ErrorCode, InferdError

from .server import Response

log = logging.getLogger("inferd.http")

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.RESOURCE_EXHAUSTED: 413,
}


def http_status(code: ErrorCode) -> int:
    return HTTP_STATUS.get(code, 500)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(status, orjson.dumps({"error": message}), headers=headers)


def from_inferd_error(exc: InferdError) -> Response:
    return error_response(http_status(exc.code), exc.message)


def from_exception(exc: BaseException) -> Response:
    """Any failure of a handler as a response; internal details stay in the log, not the reply."""
    if isinstance(exc, InferdError):
        return from_inferd_error(exc)
    log.error("unexpected error in an HTTP handler", exc_info=exc)
    return error_response(500, "internal error")


def restricted(message: str) -> Response:
    """A restricted API asked for without its header: 403, text/plain as Triton labels it."""
    return Response(403, orjson.dumps({"error": message}), "text/plain")


NOT_FOUND = Response(404, b'{"error":"Not Found"}')
METHOD_NOT_ALLOWED = Response(405, b'{"error":"Method Not Allowed"}')
