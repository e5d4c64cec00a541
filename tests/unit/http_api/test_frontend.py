"""The app-facing entry points: frontend.start / start_metrics / stop, and what they read from the config."""

from __future__ import annotations

from typing import Any

import pytest
from inferd.supervisor.config import ServerConfig
from inferd.supervisor.http_api import frontend

from .fake_dataplane import FakeDataPlane
from .rawhttp import request


def test_start_and_stop_from_config(loop_thread: Any) -> None:
    cfg = ServerConfig(model_repositories=("/nonexistent",), http_address="127.0.0.1", http_port=0,
                       metrics_address="127.0.0.1", metrics_port=0, http_max_input_size=4096)
    dp = FakeDataPlane()
    http = loop_thread.run(frontend.start(dp, cfg))
    metrics = loop_thread.run(frontend.start_metrics(dp, cfg))
    try:
        assert request(http.port, "GET", "/v2/health/live")[0] == 200
        assert request(http.port, "POST", "/v2/models/simple/infer", b" " * 5000)[0] == 413
        assert request(metrics.port, "GET", "/metrics")[0] == 200
    finally:
        loop_thread.run(http.stop())
        loop_thread.run(metrics.stop())
    with pytest.raises(OSError):
        request(http.port, "GET", "/v2/health/live")


def test_restrictions_and_forwarding_from_config(loop_thread: Any) -> None:
    """config.http_restricted and http_header_forward_pattern reach the router (flags.py parses the
    flags); the metrics port is never restricted."""
    cfg = ServerConfig(model_repositories=("/nonexistent",), http_address="127.0.0.1", http_port=0,
                       metrics_address="127.0.0.1", metrics_port=0,
                       http_restricted={"model-repository": ("admin-key", "s3"), "health": ("k", "v")},
                       http_header_forward_pattern="^x-")
    dp = FakeDataPlane()
    http = loop_thread.run(frontend.start(dp, cfg))
    metrics = loop_thread.run(frontend.start_metrics(dp, cfg))
    try:
        assert request(http.port, "GET", "/v2/health/live")[0] == 403
        assert request(http.port, "GET", "/v2/health/live", headers={"K": "v"})[0] == 200
        assert request(http.port, "POST", "/v2/repository/index")[0] == 403
        assert request(http.port, "POST", "/v2/repository/index", headers={"admin-key": "s3"})[0] == 200
        assert request(http.port, "GET", "/v2")[0] == 200
        assert request(metrics.port, "GET", "/metrics")[0] == 200
        body = b'{"inputs":[{"name":"IN","shape":[1],"datatype":"INT32","data":[1]}]}'
        status, _, _ = request(http.port, "POST", "/v2/models/params/infer", body,
                               headers={"K": "v", "X-Trace": "t1", "Other": "o"})
        assert status == 200
        assert dp.last_request is not None and dp.last_request.parameters == {"X-Trace": "t1"}
    finally:
        loop_thread.run(http.stop())
        loop_thread.run(metrics.stop())
