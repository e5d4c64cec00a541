"""Python models under the server's run-time settings, as Triton 2.51 (issue 28): pb_utils.Logger follows
POST /v2/logging in running workers; custom metrics made in initialize / changed in execute are on
/metrics in the first scrape after the call returned; a worker dying in start-up is named as Triton
names it. Unmodified tritonclient; passes against the real Triton too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import json

import numpy as np
import tritonclient.http as httpclient
from conftest import http_post, target_is_triton, wait_for


def _infer(client, model, name, array, datatype, parameters=None):
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor], parameters=parameters)


def _set_logging(server, **settings):
    status, body = http_post(server.http_base + "/v2/logging", json.dumps(settings).encode())
    assert status == 200, body


def test_model_logging_follows_the_server_settings(server_factory):
    server = server_factory(["log_probe"])
    client = server.http_client()
    plan = [("m0", {}), ("m1", {"log_verbose_level": 1, "log_info": False}),
            ("m2", {"log_verbose_level": 0, "log_info": True, "log_warning": False, "log_error": False}),
            ("m3", {"log_warning": True, "log_error": True})]
    for marker, settings in plan:
        if settings:
            _set_logging(server, **settings)
        _infer(client, "log_probe", "IN", np.zeros(1, np.int32), "INT32", {"marker": marker})
    client.close()
    wanted = ["m0-info", "m0-warning", "m0-error", "m1-verbose", "m1-warning", "m1-error", "m2-info",
              "m3-info", "m3-warning", "m3-error"]
    log = wait_for(lambda: server.log() if all(w in server.log() for w in wanted) else None, 30,
                   "the model's log lines")
    for unwanted in ["m0-verbose", "m1-info", "m2-verbose", "m2-warning", "m2-error", "m3-verbose"]:
        assert unwanted not in log


def _metric(body, line_start):
    return [line for line in body.splitlines() if line.startswith(line_start)]


def test_custom_metrics_at_the_next_scrape(server_factory):
    """No waiting: the scrape right after the load (initialize made the families) and right after the
    call (execute changed them) shows them. A long heartbeat interval: reports sent per heartbeat only
    would miss both."""
    args = [] if target_is_triton() else ["--heartbeat-interval", "5"]
    server = server_factory(["custom_metrics"], inferd_args=args)
    body = server.metrics()
    assert _metric(body, "# TYPE cm_requests counter"), body
    client = server.http_client()
    _infer(client, "custom_metrics", "VALUE", np.array([3.0], np.float32), "FP32")
    body = server.metrics()
    assert _metric(body, "cm_requests{") == ['cm_requests{model="custom_metrics",source="fixture"} 1'], body
    assert _metric(body, "cm_last_value{") == ['cm_last_value{source="fixture"} 3'], body
    client.close()


def test_worker_dying_in_start_up_is_named_as_triton_names_it(server_factory):
    server = server_factory(["init_exit", "identity_fp32"], wait_ready=["identity_fp32"])
    client = server.http_client()
    entry = wait_for(lambda: {e["name"]: e for e in client.get_model_repository_index()}["init_exit"].get("reason"),
                     60, "init_exit to fail")
    assert "Stub process 'init_exit_0_0' is not healthy." in entry
    client.close()
