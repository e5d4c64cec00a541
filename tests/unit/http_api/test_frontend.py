"""The app-facing entry points: frontend.start / start_metrics / stop, restricted-API parsing."""

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


def test_parse_restricted() -> None:
    got = frontend.parse_restricted(["model-repository,shared-memory:admin-key=s3", "inference:k=v=w"])
    assert got == {"model-repository": ("admin-key", "s3"), "shared-memory": ("admin-key", "s3"),
                   "inference": ("k", "v=w")}
    for bad in ("model-repository", "bogus:k=v", "inference:=v", "inference:k=1,inference:k=2"):
        with pytest.raises(ValueError):
            frontend.parse_restricted(bad.split(","))
