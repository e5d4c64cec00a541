"""The bytes of an HTTP/1.1 response: status lines, the head of a sized or chunked response, and the
short JSON error a connection answers before closing. connection.py does the I/O."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


STATUS_LINES: dict[int, bytes] = {s.value: _status_line(s.value) for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# content type -> its header line: one dict lookup per response (bounded: handlers choose the types)
_CONTENT_TYPES: dict[str, bytes] = {}
_CACHE_MAX = 256


def error_bytes(status: int, message: str) -> bytes:
    body = ('{{"error":"{}"}}'.format(message.replace("\\", "\\\\").replace('"', '\\"'))).encode()
    return b"".join((
        STATUS_LINES.get(status) or _status_line(status),
        b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: ",
        str(len(body)).encode(), b"\r\n\r\n", body,
    ))


def response_head(res: Any, size: int, keep: bool, conn_hdr: str | None) -> list[bytes]:
    """Status line and headers of a response with a `size`-byte body, ending with the blank line."""
    head = [STATUS_LINES.get(res.status) or _status_line(res.status)]
    ctype = res.content_type
    if ctype is not None and size:
        line = _CONTENT_TYPES.get(ctype)
        if line is None:
            line = b"Content-Type: %s\r\n" % ctype.encode("latin-1")
            if len(_CONTENT_TYPES) < _CACHE_MAX:
                _CONTENT_TYPES[ctype] = line
        head.append(line)
    if res.headers:
        for k, v in res.headers.items():
            head.append(f"{k}: {v}\r\n".encode("latin-1"))
    if not keep:
        head.append(b"Connection: close\r\n")
    elif conn_hdr is not None and conn_hdr.lower() == "keep-alive":
        head.append(b"Connection: keep-alive\r\n")  # HTTP/1.0 clients asking for keep-alive
    head.append(b"Content-Length: %d\r\n\r\n" % size)
    return head


_JSON_OK = STATUS_LINES[200] + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"


def json_ok(body: bytes) -> bytes:
    """A whole 200 response with a non-empty JSON body on a kept-alive connection whose client did not
    send `Connection` (the common answer): the bytes response_head and the body make, in one step."""
    return _JSON_OK % (len(body), body)


def chunked_head(status: int, content_type: str | None, headers: dict[str, str] | None = None,
                 keep: bool = False) -> bytes:
    """The head of a body written as it is produced (chunked); `keep`: the connection stays open after it."""
    extra = [f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()] if headers else []
    return b"".join((
        STATUS_LINES.get(status) or _status_line(status),
        b"Content-Type: %s\r\n" % (content_type or "application/octet-stream").encode("latin-1"),
        *extra,
        b"Cache-Control: no-cache\r\n",
        b"" if keep else b"Connection: close\r\n",
        b"Transfer-Encoding: chunked\r\n\r\n"))
