"""A tiny real HTTP server in a thread answering canned Triton JSON, recording what it was asked."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NOT_FOUND = (404, {"error": "Not Found"})


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # socket errors (the CLI closing its keep-alive connection while a handler thread still reads or
        # writes) are the client's business; anything else is printed (the tests check stderr stays empty)
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FakeServer:
    def __init__(self) -> None:
        # (method, path) -> (status, body: JSON-able | bytes | None)
        self.routes: dict[tuple[str, str], tuple[int, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.delay = threading.Event()  # when cleared with delay_s > 0, POST waits (a slow load)
        self.delay_s = 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append((method, self.path, json.loads(raw) if raw else None))
                if method == "POST" and fake.delay_s:
                    fake.delay.wait(fake.delay_s)
                status, body = fake.routes.get((method, self.path), NOT_FOUND)
                if body is None:
                    data = b""
                elif isinstance(body, bytes):
                    data = body
                else:
                    data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delay.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def on(self, method: str, path: str, status: int = 200, body: Any = None) -> None:
        self.routes[(method, path)] = (status, body)


INDEX = [
    {"name": "ident", "version": "1", "state": "READY"},
    {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "failed to load: boom"},
    {"name": "ondisk"},
]

STATUS = {
    "models": [
        {"name": "ident", "version": "1", "state": "READY", "reason": "",
         "instances": [
             {"name": "ident_0", "pid": 4101, "state": "ready", "restarts": 0, "last_error": "",
              "inflight": 2},
             {"name": "ident_1", "pid": 4188, "state": "ready", "restarts": 3,
              "last_error": "worker exited with signal 9 (SIGKILL)", "inflight": 0},
         ]},
        {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "failed to load: boom",
         "instances": []},
    ]
}

STATS = {"model_stats": [{
    "name": "ident", "version": "1", "last_inference": 1795300191804, "inference_count": 6,
    "execution_count": 3,
    "inference_stats": {
        "success": {"count": 3, "ns": 31396207}, "fail": {"count": 1, "ns": 5},
        "queue": {"count": 3, "ns": 447747}, "compute_input": {"count": 3, "ns": 315842},
        "compute_infer": {"count": 3, "ns": 30215776}, "compute_output": {"count": 3, "ns": 401930},
        "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
    "response_stats": {},
    "batch_stats": [{"batch_size": 2, "compute_input": {"count": 3, "ns": 315842},
                     "compute_infer": {"count": 3, "ns": 30215776},
                     "compute_output": {"count": 3, "ns": 401930}}],
    "memory_usage": []}]}

METADATA = {"name": "ident", "versions": ["1"], "platform": "python",
            "inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1, 2]}],
            "outputs": [{"name": "OUT", "datatype": "FP32", "shape": [-1, 2]}]}

CONFIG = {"name": "ident", "platform": "", "backend": "python", "max_batch_size": 8,
          "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [2]}],
          "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}]}


def triton_like() -> FakeServer:
    """Routes a Triton server answers (no /v2/inferd/status)."""
    s = FakeServer()
    s.on("GET", "/v2/health/live")
    s.on("GET", "/v2/health/ready")
    s.on("POST", "/v2/repository/index", body=INDEX)
    s.on("GET", "/v2/models/stats", body=STATS)
    s.on("GET", "/v2/models/ident/stats", body=STATS)
    s.on("GET", "/v2/models/ident/versions/1/stats", body=STATS)
    s.on("GET", "/v2/models/nope/stats", 400, {"error": "requested model 'nope' is not available"})
    s.on("GET", "/v2/models/ident", body=METADATA)
    s.on("GET", "/v2/models/ident/config", body=CONFIG)
    s.on("POST", "/v2/repository/models/ident/load")
    s.on("POST", "/v2/repository/models/ident/unload")
    s.on("POST", "/v2/repository/models/nope/load", 400,
         {"error": "failed to load 'nope', failed to poll from model repository"})
    s.on("GET", "/v2", body={"name": "triton", "version": "2.51.0", "extensions": ["statistics"]})
    return s
