"""Custom metrics from Python models (pb_utils.MetricFamily) on /metrics, and metric_tags.

The fixture model `custom_metrics` (two instances) counts requests, sets a gauge and observes a histogram
in execute. Triton 2.51 (INFERD_E2E_TARGET=triton) shows the same lines: its metric registry is one per
server, so the instances (and models) that use one family name and label set share one metric. Workers
report their metrics once per heartbeat, so every scrape here waits until the expected lines appear.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import tritonclient.http as httpclient

MODEL = "custom_metrics"
TAGS = '_team="vision",_tier="gold",'
WAIT_S = 15.0


def infer(server, values, model: str = MODEL) -> dict:
    client = server.http_client()
    try:
        errors = {}
        for value in values:
            inp = httpclient.InferInput("VALUE", [1], "FP32")
            inp.set_data_from_numpy(np.array([value], dtype=np.float32))
            result = client.infer(model, [inp])
            errors = json.loads(result.as_numpy("ERRORS")[0])
        return errors
    finally:
        client.close()


def wait_lines(server, lines: list[str], what: str) -> str:
    """Scrape until every line is in the body (exact lines); returns the body."""
    missing: list[str] = []

    def check() -> str | None:
        body = server.metrics()
        have = set(body.splitlines())
        missing[:] = [line for line in lines if line not in have]
        return body if not missing else None

    try:
        return server.wait_until(check, WAIT_S, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; missing {missing}") from None


def custom_lines(body: str) -> list[str]:
    return [line for line in body.splitlines() if "cm_" in line]


HISTOGRAM_AFTER_4 = [
    "# HELP cm_value VALUE distribution",
    "# TYPE cm_value histogram",
    'cm_value_count{source="fixture"} 4',
    'cm_value_sum{source="fixture"} 106',
    'cm_value_bucket{source="fixture",le="1"} 1',
    'cm_value_bucket{source="fixture",le="2.5"} 2',
    'cm_value_bucket{source="fixture",le="5"} 3',
    'cm_value_bucket{source="fixture",le="+Inf"} 4',
]


def test_counter_gauge_histogram_on_metrics(server_factory):
    server = server_factory([MODEL])
    infer(server, [0.5, 3.0, 100.0, 2.5])  # two instances take them: one metric each, merged
    body = wait_lines(server, [
        "# HELP cm_requests Requests seen by the model",
        "# TYPE cm_requests counter",
        'cm_requests{model="custom_metrics",source="fixture"} 4',
        "# HELP cm_last_value The last VALUE received",
        "# TYPE cm_last_value gauge",
        'cm_last_value{source="fixture"} 2.5',
        *HISTOGRAM_AFTER_4,
        "# HELP cm_plain Unlabelled counter",
        "# TYPE cm_plain counter",
        "cm_plain 2",
    ], "the custom metrics after 4 requests")
    lines = body.splitlines()
    # a histogram as Triton lays it out: _count, _sum, then the buckets in order
    start = lines.index(HISTOGRAM_AFTER_4[0])
    assert lines[start:start + len(HISTOGRAM_AFTER_4)] == HISTOGRAM_AFTER_4
    assert "cm_requests" not in " ".join(line for line in lines if line.startswith("nv_"))
    infer(server, [7.0])
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 5', 'cm_last_value{source="fixture"} 7',
                        'cm_value_bucket{source="fixture",le="+Inf"} 5', "cm_plain 2.5"], "the 5th request")


def test_errors_the_model_sees(server_factory, harness):
    server = server_factory([MODEL])
    triton = harness.target_is_triton()
    errors: dict = {}
    for k in range(1, 20):  # one failing call per request (see the model)
        if triton and k not in (4, 5, 6, 12):
            # the failures Triton's server process reports back to the stub: Triton 2.51 aborts at random on
            # them (boost::interprocess::lock_exception), and always on set() of a counter (k=10)
            continue
        got = infer(server, [-float(k)])
        if not got:
            break
        errors.update(got)
    assert len(errors) == (4 if triton else 12), errors
    expected = {
        "labels_not_dict": "Failed to create metric. Labels must be a dictionary.",
        "missing_buckets": "Failed to create metric. Missing required buckets.",
        "unexpected_buckets": "Failed to create metric. Unexpected buckets found.",
    }
    if triton:
        assert errors["server_name"] is None  # Triton lets a model write into its own nv_inference_count
    else:
        # Triton's words where Triton has them (seen one call at a time), with what inferd adds after them
        expected.update({
            "bad_name": "Error when creating MetricFamily: Invalid metric name 'bad-name'",
            "reserved_double_underscore": "Error when creating MetricFamily: Invalid metric name '__x'",
            "bad_label": "Error when creating Metric: Invalid label name 'bad-label'",
            "unsorted_buckets": "Error when creating Metric: Bucket Boundaries must be strictly sorted",
            "negative_counter": "Failed to increment metric value: Failed to process the request for model "
                                "'custom_metrics_0_",
            "histogram_value": "Failed to get metric value: Failed to process the request for model 'custom_metrics_0_",
            "counter_set": "Failed to set metric value: Failed to process the request for model 'custom_metrics_0_",
            "gauge_observe": "Failed to observe metric value: Failed to process the request for model "
                             "'custom_metrics_0_",
            "server_name": "Error when creating MetricFamily: metric family name 'nv_inference_count' is reserved "
                           "for the server's own metrics",
        })
        assert "message: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative " \
               "values." in errors["negative_counter"]
        assert errors["histogram_value"].endswith("message: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
        assert errors["counter_set"].endswith("message: TRITONSERVER_METRIC_KIND_COUNTER does not support Set")
        assert errors["gauge_observe"].endswith("message: TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")
    for key, text in expected.items():
        assert errors[key] and errors[key].startswith("TritonModelException: " + text), (key, errors)
    # the failed calls changed nothing
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 0', "cm_plain 0"], "untouched metrics")


def test_metric_tags_label_the_model_metrics(server_factory):
    server = server_factory([MODEL, "add_sub"])
    infer(server, [1.0, 2.0])
    wait_lines(server, [
        f'nv_inference_request_success{{{TAGS}model="custom_metrics",version="1"}} 2',
        f'nv_inference_count{{{TAGS}model="custom_metrics",version="1"}} 2',
        f'nv_inference_exec_count{{{TAGS}model="custom_metrics",version="1"}} 2',
        f'nv_inference_request_failure{{{TAGS}model="custom_metrics",reason="BACKEND",version="1"}} 0',
        f'nv_inference_pending_request_count{{{TAGS}model="custom_metrics",version="1"}} 0',
        'nv_inference_count{model="add_sub",version="1"} 0',  # a model without tags
    ], "metric_tags labels")
    # custom metrics get only the labels the model gave them
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 2'], "the counter")


def test_models_share_one_family(server_factory):
    """One family name and label set is one metric server-wide, whichever model made it (as in Triton)."""
    server = server_factory({MODEL: MODEL, "custom_metrics_b": MODEL})
    infer(server, [0.5, 3.0])
    infer(server, [100.0, 2.5], model="custom_metrics_b")
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 4', *HISTOGRAM_AFTER_4,
                        'cm_last_value{source="fixture"} 2.5'], "metrics of two models merged")


@pytest.mark.inferd_only
def test_metrics_leave_with_the_model(server_factory):
    """Unloading a model removes its metrics (Triton 2.51 keeps exporting them until the server exits)."""
    server = server_factory([MODEL], control_mode="explicit", load_models=[MODEL])
    infer(server, [1.0, 2.0, 3.0])
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 3'], "the counter")
    status, body = server.post(f"/v2/repository/models/{MODEL}/unload")
    assert status == 200, body
    server.wait_until(lambda: not custom_lines(server.metrics()), WAIT_S, "the custom metrics to go")
    status, body = server.post(f"/v2/repository/models/{MODEL}/load")
    assert status == 200, body
    infer(server, [1.0])
    body = wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 1'], "a counter from zero")
    assert 'cm_value_count{source="fixture"} 1' in body.splitlines()


@pytest.mark.inferd_only
def test_counts_survive_the_restart_of_one_instance(server_factory):
    """A worker that dies takes its metrics along, but what it counted stays in a metric the other
    instance still holds; the restarted worker counts on from there."""
    server = server_factory([MODEL])
    infer(server, [0.5, 3.0, 100.0, 2.5])
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 4', *HISTOGRAM_AFTER_4], "4 requests")
    before = server.worker_pids(MODEL)
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)
    server.wait_until(lambda: len(set(server.worker_pids(MODEL)) - set(before)) == 1, WAIT_S, "a replacement worker")
    server.wait_until(lambda: server.model_ready(MODEL), WAIT_S, "the model ready again")
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 4', *HISTOGRAM_AFTER_4], "counts kept")
    infer(server, [1.0, 1.0])
    wait_lines(server, ['cm_requests{model="custom_metrics",source="fixture"} 6',
                        'cm_value_bucket{source="fixture",le="1"} 3'], "counting on")


def test_a_metric_call_is_on_metrics_when_it_returns(server_factory):
    """Triton's qa custom_metrics cases: the model changes metrics and scrapes /metrics inside the same
    execute; every change must be there (python_backend's metric calls go to the server and back)."""
    server = server_factory(["metrics_scrape"])
    client = server.http_client()
    try:
        inp = httpclient.InferInput("URL", [1], "BYTES")
        inp.set_data_from_numpy(np.array([server.metrics_url.encode()], dtype=np.object_))
        result = json.loads(client.infer("metrics_scrape", [inp]).as_numpy("RESULT")[0])
    finally:
        client.close()
    assert result == {case: "ok" for case in result} and len(result) == 6, result
