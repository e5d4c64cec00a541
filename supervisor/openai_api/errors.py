"""Every refusal of the OpenAI API as the OpenAI error object, with its HTTP status:
`{"error": {"message", "type", "param", "code"}}` (the `openai` SDK reads `message`, `type`, `param` and
`code` from it and raises the exception class of the status).

Statuses follow Triton's OpenAI frontend where its tests pin them (422 for a body that does not fit the
schema, 400 for what it refuses, 401 for a restricted API, 413 for a body over the limit, 500 for a server
fault) and OpenAI where Triton has none of its own (404 for an unknown model). docs/openai.md lists them.
"""

from __future__ import annotations

import logging

import orjson
from inferd.supervisor.http_api.request_cycle import Response
from inferd.worker.wire.errors import ErrorCode, InferdError

log = logging.getLogger("inferd.openai")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# the data plane's error codes as OpenAI statuses and types
_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.NOT_FOUND: (404, INVALID_REQUEST),
    ErrorCode.INVALID_ARG: (400, INVALID_REQUEST),
    ErrorCode.ALREADY_EXISTS: (400, INVALID_REQUEST),
    ErrorCode.UNSUPPORTED: (400, INVALID_REQUEST),
    ErrorCode.RESOURCE_EXHAUSTED: (413, INVALID_REQUEST),
    ErrorCode.CANCELLED: (400, INVALID_REQUEST),
    ErrorCode.UNAVAILABLE: (503, SERVER_ERROR),
    ErrorCode.INTERNAL: (500, SERVER_ERROR),
    ErrorCode.UNKNOWN: (500, SERVER_ERROR),
}


class OpenAIError(Exception):
    """A refusal: raised anywhere below a route, answered by `response()`."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(self.status, orjson.dumps(self.body()))


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def invalid_body(message: str, param: str | None = None) -> OpenAIError:
    """The body does not fit the request's schema (Triton's FastAPI answers these 422)."""
    return OpenAIError(422, message, param=param, code="invalid_value")


def unknown_model(name: str) -> OpenAIError:
    return OpenAIError(404, f"Unknown model: {name}", param="model", code="model_not_found")


def server_error(message: str) -> OpenAIError:
    return OpenAIError(500, message, type=SERVER_ERROR)


def from_inferd(exc: InferdError) -> OpenAIError:
    status, kind = _STATUS.get(exc.code, (500, SERVER_ERROR))
    return OpenAIError(status, exc.message, type=kind)


def from_exception(exc: BaseException) -> OpenAIError:
    """Any failure below a route as an OpenAIError; internal details stay in the log."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, InferdError):
        return from_inferd(exc)
    log.error("unexpected error in an OpenAI API handler", exc_info=exc)
    return server_error("internal error")


def response(exc: BaseException) -> Response:
    return from_exception(exc).response()


def fatal_bytes(status: int, message: str, max_body: int, content_length: str | None) -> bytes:
    """A whole HTTP/1.1 answer to a request the connection refuses before the route sees it (body over the
    limit, malformed HTTP, timeouts), in the OpenAI shape; the connection closes after it."""
    code = None
    if status == 413:
        size = f"{content_length} bytes " if content_length and content_length.isdigit() else ""
        message = (f"Request size {'of ' + size if size else ''}exceeds the maximum allowed input size of "
                   f"{max_body} bytes. Use --http-max-input-size to increase the limit.")
        code = "content_too_large"
    kind = INVALID_REQUEST if status < 500 else SERVER_ERROR
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    reason = {400: "Bad Request", 408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long",
              417: "Expectation Failed", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason.get(status, "Error").encode(), len(body)) + body)
