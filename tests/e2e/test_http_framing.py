"""HTTP/1.1 framing a hostile client tries (issue 38 items 1 and 5), over raw sockets against a real server,
once with one process and once with `--frontend-processes 2` (the frontends read requests with the same
reader). With INFERD_E2E_TARGET=triton the same checks run against Triton 2.51 (one process), which is where
the expected behaviour comes from: Upgrade is ignored (the request is answered once, with its body, and what
is pipelined after it is served), CONNECT gets one 404, and an endless trailer line is cut off."""

from __future__ import annotations

import json
import socket
import threading
import time

import psutil
import pytest
from conftest import target_is_triton

ADD_SUB = "/v2/models/add_sub/infer"
IN0 = [float(i) for i in range(16)]
IN1 = [1.0] * 16


@pytest.fixture(scope="module", params=["one process", "frontend processes"])
def server(request, module_server_factory):
    if request.param == "frontend processes":
        if target_is_triton():
            pytest.skip("inferd's --frontend-processes")
        return module_server_factory(["add_sub"], inferd_args=["--frontend-processes", "2"])
    return module_server_factory(["add_sub"])


def _infer(shift: float = 0.0) -> bytes:
    return json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [x + shift for x in IN0]},
        {"name": "INPUT1", "shape": [16], "datatype": "FP32", "data": IN1},
    ]}).encode()


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (path.encode(), extra, len(body), body)


class Conn:
    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return False
        self.buf += data
        return bool(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before a response; read {self.buf[:200]!r}")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("closed inside a response body")
        body, self.buf = self.buf[:n], self.buf[n:]
        return int(lines[0].split()[1]), headers, body

    def rest(self, quiet: float) -> bytes:
        """What the server still writes before it closes, or before `quiet` seconds pass with nothing (Triton
        keeps a connection open where inferd closes it)."""
        self.sock.settimeout(quiet)
        try:
            while self._fill():
                pass
        except TimeoutError:
            pass
        return self.buf

    def close(self) -> None:
        self.sock.close()


def _sums(body: bytes, shift: float = 0.0) -> list[float]:
    out = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    return out["OUTPUT0"] if out["OUTPUT0"] == [x + shift + 1 for x in IN0] else []


def _in_step(conn: Conn) -> None:
    """No stray answer is waiting: the next answer is the one to our metadata request."""
    conn.sock.sendall(b"GET /v2/models/add_sub HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = conn.response()
    assert status == 200 and json.loads(body)["name"] == "add_sub", body[:200]


H2C = b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABk\r\n"
WEBSOCKET = (b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("upgrade", [H2C, WEBSOCKET], ids=["h2c", "websocket"])
def test_upgrade_is_ignored(server, upgrade: bytes, chunked: bool) -> None:
    """Before: inferd answered the infer with an empty body (400), then parsed its body as a request (a
    second, unsolicited 400) and closed: the request pipelined after it was never answered."""
    body = _infer(1.0)
    if chunked:
        first = (b"POST %s HTTP/1.1\r\nHost: x\r\n%sTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                 % (ADD_SUB.encode(), upgrade, len(body), body))
    else:
        first = _post(ADD_SUB, body, upgrade)
    conn = Conn(server.http_port)
    try:
        conn.sock.sendall(first + _post(ADD_SUB, _infer(2.0)))
        status, headers, raw = conn.response()
        assert status == 200 and _sums(raw, 1.0), raw[:300]
        assert "upgrade" not in headers
        status, _, raw = conn.response()
        assert status == 200 and _sums(raw, 2.0), raw[:300]
        _in_step(conn)
    finally:
        conn.close()


def test_connect_is_answered_once(server) -> None:
    """Triton answers a CONNECT 404 and nothing after it; before, inferd then parsed what followed as a
    request and wrote a second, unsolicited 400. inferd now closes the connection after the 404."""
    conn = Conn(server.http_port)
    try:
        conn.sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
                          + _post(ADD_SUB, _infer()))
        status, _, body = conn.response()
        assert status == 404 and json.loads(body) == {"error": "Not Found"}
        assert conn.rest(quiet=2.0) == b""
    finally:
        conn.close()


def test_bytes_after_a_closing_request_are_not_answered(server) -> None:
    """Before: the parser's refusal of bytes after a `Connection: close` request was answered (400) in place
    of the running infer's answer. inferd answers the request and closes (RFC 9112 9.6: no later request
    is processed); Triton answers the pipelined request too."""
    conn = Conn(server.http_port)
    try:
        conn.sock.sendall(_post(ADD_SUB, _infer(), b"Connection: close\r\n") + b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        status, _, raw = conn.response()
        assert status == 200 and _sums(raw), raw[:300]
        rest = conn.rest(quiet=2.0)
        if target_is_triton():
            assert rest == b"" or rest.startswith(b"HTTP/1.1 200 "), rest[:200]
        else:
            assert rest == b""
    finally:
        conn.close()


def _tree_rss_mib(pid: int) -> float:
    total = 0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def test_endless_trailer_line_is_cut_off(server) -> None:
    """One trailer line that never ends, 32 MiB of it (issue 38 item 1: before, the server kept every byte
    and burnt CPU quadratically joining them while other clients waited seconds). Now the connection is cut
    off at the head cap (inferd: 431; Triton: closed), memory stays flat and another client is answered."""
    rss0 = _tree_rss_mib(server.pid)
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    answer: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                answer.append(data)
        except OSError:
            pass
        done.set()

    threading.Thread(target=read, daemon=True).start()
    sent = 0
    try:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n0\r\nX-T: "
                     % ADD_SUB.encode())
        piece = b"a" * 65536
        while sent < 32 << 20 and not done.is_set():
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass
    try:
        start = time.monotonic()
        status, _ = server.get("/v2/health/ready", timeout=10)
        took = time.monotonic() - start
        assert done.wait(10), "the connection is still open"
        rss = _tree_rss_mib(server.pid)
        print(f"\ntrailer flood: cut off after {sent >> 10} KiB sent, RSS {rss0:.0f} -> {rss:.0f} MiB, "
              f"ready in {took * 1000:.0f} ms")
        reply = b"".join(answer)
        assert sent < 32 << 20, "every byte was taken"
        assert not reply or reply.startswith(b"HTTP/1.1 431 "), reply[:200]
        if not target_is_triton():
            assert reply.startswith(b"HTTP/1.1 431 ")
        assert rss <= rss0 + 24, f"RSS {rss:.0f} MiB after the flood, {rss0:.0f} before"
        assert status == 200 and took < 2.0
    finally:
        sock.close()
