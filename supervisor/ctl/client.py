"""A small blocking client for the server's public HTTP API (stdlib only, for a fast CLI start)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import quote, urlsplit

DEFAULT_URL = "http://localhost:8000"


class CtlError(Exception):
    """A failure to report as ``error: <message>`` with a non-zero exit."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status  # HTTP status when the server answered, else 0


class Unreachable(CtlError):
    pass


def model_path(name: str, version: str = "") -> str:
    path = "/v2/models/" + quote(name, safe="")
    if version:
        path += "/versions/" + quote(version, safe="")
    return path


class Client:
    def __init__(self, url: str = DEFAULT_URL, timeout: float | None = 30.0,
                 headers: dict[str, str] | None = None) -> None:
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"invalid server URL {url!r} (expected http://host:port)")
        self.url = url.rstrip("/")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = dict(headers or {})  # sent with every request (--header)

    def request(
        self, method: str, path: str, body: Any = None, timeout: float | None = -1.0
    ) -> tuple[int, bytes]:
        """(status, body). timeout -1 = the client's default; None = wait as long as it takes."""
        conn_cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = conn_cls(self.host, self.port, timeout=self.timeout if timeout == -1.0 else timeout)
        payload = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, self.prefix + path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (ConnectionRefusedError, socket.gaierror) as exc:
            reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
            raise Unreachable(
                f"cannot connect to the server at {self.url} ({reason}); "
                "is it running? Set --url or INFERD_URL"
            ) from None
        except TimeoutError:
            raise Unreachable(f"no answer from the server at {self.url} (timed out)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"connection to the server at {self.url} failed: {exc}") from None
        finally:
            conn.close()

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = -1.0) -> Any:
        """The decoded JSON reply (None for an empty body); raises CtlError on an error status."""
        status, data = self.request(method, path, body, timeout)
        if status >= 400:
            raise CtlError(error_message(status, data), status)
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise CtlError(f"the server sent invalid JSON for {method} {path}", status) from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any = None, timeout: float | None = -1.0) -> Any:
        return self.call("POST", path, body, timeout)


def error_message(status: int, data: bytes) -> str:
    """The server's {"error": "..."} message, or the status line and body text."""
    text = data.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"]:
        return doc["error"]
    reason = http.client.responses.get(status, "error")
    detail = (": " + text[:500]) if text else ""
    return f"HTTP {status} {reason}{detail}"
