"""--http-restricted-api and --http-header-forward-pattern in the router (header_rules.py has the rules).

The category of each endpoint and the refusal were read off Triton 2.51 with every category
restricted to its own header.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
from inferd.supervisor.config import RESTRICTABLE
from inferd.supervisor.http_api import start_http_api

from .conftest import LoopThread, Served
from .fake_dataplane import FakeDataPlane
from .rawhttp import RawConn, build, error_of, request

# (method, path, category): Triton 2.51's answer to each, with every category restricted
ROUTES = [
    ("GET", "/v2", "metadata"),
    ("GET", "/v2/health/live", "health"),
    ("GET", "/v2/health/ready", "health"),
    ("GET", "/v2/models/simple", "metadata"),
    ("GET", "/v2/models/simple/versions/1", "metadata"),
    ("GET", "/v2/models/simple/ready", "health"),
    ("GET", "/v2/models/simple/config", "model-config"),
    ("GET", "/v2/models/simple/stats", "statistics"),
    ("GET", "/v2/models/stats", "statistics"),
    ("POST", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/repository/models/simple/load", "model-repository"),
    ("POST", "/v2/repository/models/simple/unload", "model-repository"),
    ("POST", "/v2/repository/x/models/simple/load", "model-repository"),
    ("GET", "/v2/systemsharedmemory/status", "shared-memory"),
    ("GET", "/v2/systemsharedmemory/region/r/status", "shared-memory"),
    ("POST", "/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("POST", "/v2/cudasharedmemory/unregister", "shared-memory"),
    ("GET", "/v2/trace/setting", "trace"),
    ("POST", "/v2/trace/setting", "trace"),
    ("GET", "/v2/models/simple/trace/setting", "trace"),
    ("GET", "/v2/logging", "logging"),
    ("POST", "/v2/logging", "logging"),
    ("POST", "/v2/models/simple/infer", "inference"),
    ("POST", "/v2/models/simple/versions/1/infer", "inference"),
    ("POST", "/v2/models/simple/generate", "inference"),
    ("POST", "/v2/models/simple/generate_stream", "inference"),
    ("GET", "/v2/models/nope/infer", "inference"),  # before the method and the model are looked at
    # inferd's own: the status view of models, instances and workers is a repository view
    ("GET", "/v2/inferd/status", "model-repository"),
    ("GET", "/v2/inferd/status/models/simple", "model-repository"),
]


def _serve(loop_thread: LoopThread, **kw: Any) -> Iterator[Served]:
    dp = FakeDataPlane()
    server = loop_thread.run(start_http_api(dp, "127.0.0.1", 0, **kw))
    try:
        yield Served(loop_thread, server, dp)
    finally:
        loop_thread.run(server.wait_closed(2.0))


@pytest.fixture(scope="module")
def restricted(loop_thread: LoopThread) -> Iterator[Served]:
    yield from _serve(loop_thread, restricted={cat: (f"k-{cat}", "v") for cat in RESTRICTABLE})


@pytest.fixture(scope="module")
def forwarding(loop_thread: LoopThread) -> Iterator[Served]:
    yield from _serve(loop_thread, header_forward_pattern="x-fw.*")


def test_every_category_is_named() -> None:
    assert {cat for _, _, cat in ROUTES} == set(RESTRICTABLE)


@pytest.mark.parametrize(("method", "path", "category"), ROUTES)
def test_route_category(restricted: Served, method: str, path: str, category: str) -> None:
    status, headers, body = request(restricted.port, method, path)
    assert status == 403
    assert headers["content-type"] == "text/plain"  # as Triton labels it
    assert json.loads(body) == {"error": f"This API is restricted, expecting header 'k-{category}'"}
    status, _, _ = request(restricted.port, method, path, headers={f"k-{category}": "v"})
    assert status != 403


def test_unknown_paths_stay_404(restricted: Served) -> None:
    assert request(restricted.port, "GET", "/v2/bogus")[0] == 404
    assert request(restricted.port, "GET", "/v2/models/simple/bogus")[0] == 404


def test_header_name_any_case_value_exact(restricted: Served) -> None:
    port = restricted.port
    assert request(port, "GET", "/v2/health/live", headers={"K-HEALTH": "v"})[0] == 200
    for wrong in ("V", "w", "", "v "):
        assert request(port, "GET", "/v2/health/live", headers={"k-health": wrong})[0] == 403, repr(wrong)
    assert request(port, "GET", "/v2/health/live", headers={"k-health": "  v"})[0] == 200  # leading blanks go


def test_non_ascii_value(loop_thread: LoopThread) -> None:
    for served in _serve(loop_thread, restricted={"health": ("key", "café")}):
        conn = RawConn(served.port)
        try:
            conn.send(build("GET", "/v2/health/live").replace(b"\r\n\r\n", "\r\nkey: café\r\n\r\n".encode()))
            assert conn.read_response()[0] == 200
        finally:
            conn.close()
        assert request(served.port, "GET", "/v2/health/live", headers={"key": "cafe"})[0] == 403


def test_unrestricted_server_keeps_no_raw_headers(loop_thread: LoopThread) -> None:
    for served in _serve(loop_thread):
        assert served.server.connection_class.__name__ == "HttpConnection"
    for served in _serve(loop_thread, header_forward_pattern="x"):
        assert served.server.connection_class.__name__ == "KeepCaseConnection"


INFER_BODY = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}


def _forwarded(served: Served, headers: dict[str, str] | list[tuple[str, str]], doc: Any = None,
               encoding: str = "") -> dict[str, Any]:
    body = json.dumps(doc or INFER_BODY).encode()
    if encoding:
        body = gzip.compress(body)
    conn = RawConn(served.port)
    try:
        head = build("POST", "/v2/models/params/infer", body, {"Content-Encoding": encoding} if encoding else None)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers.items() if isinstance(headers, dict) else headers))
        conn.send(head.replace(b"\r\n\r\n", ("\r\n" + extra).encode("latin-1") + b"\r\n", 1))
        status, _, answer = conn.read_response()
    finally:
        conn.close()
    assert status == 200, answer
    assert served.dp.last_request is not None
    return dict(served.dp.last_request.parameters)


def test_forwarded_headers_become_string_parameters(forwarding: Served) -> None:
    got = _forwarded(forwarding, {"X-Fw-Alpha": "One", "x-fwb": "two", "my-x-fw": "3", "X-FW-UP": "4",
                                  "other": "5"})
    assert got == {"X-Fw-Alpha": "One", "x-fwb": "two", "my-x-fw": "3", "X-FW-UP": "4"}  # names as sent


def test_forwarded_after_the_request_parameters(forwarding: Served) -> None:
    doc = dict(INFER_BODY, parameters={"x-fw-num": 7, "keep": True})
    got = _forwarded(forwarding, [("x-fw-num", "9"), ("x-fw-a", "1"), ("x-fw-a", "2")], doc)
    assert got == {"x-fw-num": "9", "keep": True, "x-fw-a": "2"}  # what the model parses from Triton's JSON


def test_forwarded_on_a_compressed_request(forwarding: Served) -> None:
    assert _forwarded(forwarding, {"X-Fw-Z": "z"}, encoding="gzip") == {"X-Fw-Z": "z"}


def test_generate_gets_no_forwarded_headers(forwarding: Served) -> None:
    forwarding.dp.last_request = None
    status, _, body = request(forwarding.port, "POST", "/v2/models/params/generate", b'{"IN": [1]}',
                              headers={"x-fw-a": "1"})
    assert status == 200, error_of(body)
    assert forwarding.dp.last_request is not None and forwarding.dp.last_request.parameters == {}
