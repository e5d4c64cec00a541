"""A tiny blocking HTTP/1.1 client over a raw socket, for malformed and pipelined requests."""

from __future__ import annotations

import json
import socket
from typing import Any


class RawConn:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = bytearray()  # appended in place: a large answer is not copied once per read

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError("closed before a response")
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        self.buf = bytearray(rest)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("closed inside a response body")
        body, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return status, headers, body

    def wait_closed(self) -> bool:
        """True when the server closes (EOF or reset) before the socket timeout."""
        try:
            while self._fill():
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def build(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
          content_length: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    hdrs = dict(headers or {})
    if content_length and "Transfer-Encoding" not in hdrs:
        hdrs.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in hdrs.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def request(port: int, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = RawConn(port)
    try:
        conn.send(build(method, path, body, headers))
        return conn.read_response()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    doc: Any = json.loads(body)
    return str(doc["error"])
