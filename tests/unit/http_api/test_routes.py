"""Router: paths, methods and the status codes of reference/triton.md §1.1-1.2."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from inferd.supervisor.http_api.errors import HTTP_STATUS
from inferd.worker.wire.errors import ErrorCode

from .rawhttp import error_of, request


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v2", 200),
    ("GET", "/v2/", 200),
    ("GET", "/v2/health/live", 200),
    ("GET", "/v2/health/ready", 200),
    ("GET", "/v2/models/simple", 200),
    ("GET", "/v2/models/simple/versions/1", 200),
    ("GET", "/v2/models/simple/versions/1/ready", 200),
    ("GET", "/v2/models/simple/config", 200),
    ("GET", "/v2/models/simple/versions/1/config", 200),
    ("GET", "/v2/models/simple/stats", 200),
    ("GET", "/v2/models/stats", 200),
    ("GET", "/v2/trace/setting", 200),
    ("GET", "/v2/models/simple/trace/setting", 200),
    ("GET", "/v2/logging", 200),
    ("GET", "/v2/systemsharedmemory/status", 200),
    ("POST", "/v2/systemsharedmemory/unregister", 200),
    ("POST", "/v2/repository/index", 200),
    ("GET", "/v2/models/simple/versions/x1", 404),  # version must be digits
    ("GET", "/v2/models/simple/versions/1/trace/setting", 404),
    ("GET", "/v2/models/simple/nothing", 404),
    ("GET", "/v2/bogus", 404),
    ("GET", "/v1/models", 404),
    ("GET", "/", 404),
    ("POST", "/v2/health/live", 405),
    ("GET", "/v2/models/simple/infer", 405),
    ("GET", "/v2/repository/index", 405),
    ("DELETE", "/v2/models/simple", 405),
    ("GET", "/v2/models/simple/versions/3", 404),  # known model, unknown version: NOT_FOUND
    ("GET", "/v2/models/nope", 400),  # unknown model: INVALID_ARG
    ("GET", "/v2/models/notready/ready", 400),
    ("POST", "/v2/repository/other/models/simple/load", 501),
])
def test_route_status(served: Any, method: str, path: str, status: int) -> None:
    got, _, body = request(served.port, method, path)
    assert got == status, body
    if status == 404 and "versions/3" not in path:
        assert json.loads(body) == {"error": "Not Found"}


def test_health_bodies(served: Any) -> None:
    status, headers, body = request(served.port, "GET", "/v2/health/ready")
    assert status == 200 and body == b"" and headers["content-length"] == "0"
    served.dp.is_ready = False
    try:
        status, _, body = request(served.port, "GET", "/v2/health/ready")
        assert status == 400 and body == b""
    finally:
        served.dp.is_ready = True
    status, _, body = request(served.port, "GET", "/v2/models/notready/ready")
    assert json.loads(body) == {"error": "Model version not ready"}


def test_repo_named_message(served: Any) -> None:
    _, _, body = request(served.port, "POST", "/v2/repository/r/models/simple/unload")
    assert error_of(body) == "'repository_name' specification is not supported"


def test_repository_bodies(served: Any) -> None:
    status, _, body = request(served.port, "POST", "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400
    status, _, body = request(served.port, "POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and isinstance(json.loads(body), list)
    status, _, body = request(served.port, "POST", "/v2/repository/models/simple/load",
                              b'{"parameters": {"file:1/model.py": "***"}}')
    assert status == 400 and "base64" in error_of(body)
    status, _, body = request(served.port, "POST", "/v2/repository/models/simple/unload",
                              b'{"parameters": {"unload_dependents": 1}}')
    assert status == 400
    status, _, body = request(served.port, "POST", "/v2/repository/models/simple/load", b"[1]")
    assert status == 400
    status, _, body = request(served.port, "POST", "/v2/repository/models/simple/load", b"{")
    assert status == 400 and "parse" in error_of(body)


def test_shm_register_validation(served: Any) -> None:
    bad = [b'{"key": "/x", "offset": -1, "byte_size": 4}', b'{"key": 3, "byte_size": 4}',
           b'{"key": "/x", "byte_size": "4"}', b'{"key": "/x"}']
    for body in bad:
        status, _, _ = request(served.port, "POST", "/v2/systemsharedmemory/region/r/register", body)
        assert status == 400, body
    handle = base64.b64encode(b"\0" * 64).decode()
    status, _, body = request(served.port, "POST", "/v2/cudasharedmemory/region/r/register",
                              json.dumps({"raw_handle": {"b64": handle}, "device_id": 0,
                                          "byte_size": 8}).encode())
    assert status == 501 and "CUDA" in error_of(body)  # the fake data plane's UNSUPPORTED
    status, _, _ = request(served.port, "POST", "/v2/cudasharedmemory/region/r/register",
                           b'{"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 8}')
    assert status == 400


def test_percent_encoded_names_reach_the_data_plane(served: Any) -> None:
    status, _, body = request(served.port, "GET", "/v2/models/%2e%2e%2fetc")
    assert status == 400 and "'../etc'" in error_of(body)
    status, _, body = request(served.port, "GET", "/v2/models/sim%70le")
    assert status == 200


def test_restricted_api(loop_thread: Any) -> None:
    from inferd.supervisor.http_api import start_http_api

    from .fake_dataplane import FakeDataPlane

    async def start() -> Any:
        return await start_http_api(FakeDataPlane(), "127.0.0.1", 0,
                                    restricted={"model-repository": ("Admin-Key", "s3cret")})

    server = loop_thread.run(start())
    try:
        status, _, body = request(server.port, "POST", "/v2/repository/index")
        assert status == 403 and "admin-key" in error_of(body).lower()
        status, _, _ = request(server.port, "POST", "/v2/repository/index", headers={"Admin-Key": "wrong"})
        assert status == 403
        status, _, _ = request(server.port, "POST", "/v2/repository/index", headers={"admin-key": "s3cret"})
        assert status == 200
        status, _, _ = request(server.port, "GET", "/v2/health/ready")
        assert status == 200
    finally:
        loop_thread.run(server.wait_closed(2.0))


def test_inferd_status_route(served: Any) -> None:
    assert request(served.port, "GET", "/v2/inferd/status")[0] == 501  # the ABC's default: UNSUPPORTED
    served.dp.status = lambda name="": {"models": [{"name": name or "all"}]}
    try:
        status, _, body = request(served.port, "GET", "/v2/inferd/status")
        assert status == 200 and json.loads(body) == {"models": [{"name": "all"}]}
        status, _, body = request(served.port, "GET", "/v2/inferd/status/models/simple")
        assert status == 200 and json.loads(body) == {"models": [{"name": "simple"}]}
        assert request(served.port, "POST", "/v2/inferd/status")[0] == 405
        assert request(served.port, "GET", "/v2/inferd/status/other")[0] == 404
    finally:
        del served.dp.status


def test_error_table() -> None:
    assert HTTP_STATUS[ErrorCode.INTERNAL] == 500
    assert HTTP_STATUS[ErrorCode.NOT_FOUND] == 404
    assert HTTP_STATUS[ErrorCode.UNAVAILABLE] == 503
    assert HTTP_STATUS[ErrorCode.UNSUPPORTED] == 501
    assert HTTP_STATUS[ErrorCode.RESOURCE_EXHAUSTED] == 413
    for code in (ErrorCode.UNKNOWN, ErrorCode.INVALID_ARG, ErrorCode.ALREADY_EXISTS, ErrorCode.CANCELLED):
        assert HTTP_STATUS[code] == 400
    assert set(HTTP_STATUS) == set(ErrorCode)
