"""Every query of the provisioned Grafana dashboard (deploy/docker/grafana/dashboards/inferd.json) returns
data from a real Prometheus scraping a real inferd (issue 23 item 6).

Needs Debian's `prometheus` binary (`apt-get install prometheus`); skipped without it, except where
INFERD_REQUIRE_PROMETHEUS=1 (set by .ci/run, which installs it) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "grafana" / "dashboards" / "inferd.json"
# Grafana's variables, as Grafana would expand them: all models, a rate window of several scrapes
VARIABLES = {"$__rate_interval": "30s", '"$model"': '".+"'}


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def test_dashboard_is_provisionable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"]
    exprs = " ".join(e for _, e in dashboard_queries())
    for metric in ("nv_inference_count", "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
                   "nv_inference_pending_request_count", "nv_inference_request_failure", "nv_cpu_utilization",
                   "nv_gpu_utilization"):
        assert metric in exprs, metric
    assert 'quantile="0.5"' in exprs and 'quantile="0.99"' in exprs
    assert "$" not in exprs, "a Grafana variable the test does not expand"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "model"}
    grafana = DASHBOARD.parents[1]
    assert "path: /var/lib/grafana/dashboards" in (grafana / "provisioning/dashboards/inferd.yml").read_text()
    assert "url: http://prometheus:9090" in (grafana / "provisioning/datasources/prometheus.yml").read_text()
    compose = (grafana.parent / "compose.yaml").read_text()
    assert "./grafana/dashboards:/var/lib/grafana/dashboards" in compose and "summary_latencies=true" in compose


@pytest.fixture
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    if path is None:
        reason = "Debian's prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
        if os.environ.get("INFERD_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


def _infer(server) -> None:
    client = server.http_client()
    import tritonclient.http as httpclient

    inputs = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(16, dtype=np.float32))
    client.infer("add_sub", inputs)
    client.close()


def test_every_dashboard_query_returns_data(server_factory, harness, tmp_path: Path, prometheus_bin: str):
    server = server_factory(["add_sub"], inferd_args=["--metrics-config", "summary_latencies=true"])
    _infer(server)
    gpu = "nv_gpu_utilization" in server.metrics()

    (prom_port,) = harness.free_ports(1)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: inferd\n    static_configs: [{{targets: ['127.0.0.1:{server.metrics_port}']}}]\n")
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as log_file:
        prom = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{prom_port}/api/v1"

    def query(expr: str) -> list:
        status, body = harness.http_get(f"{api}/query?{urllib.parse.urlencode({'query': expr})}", timeout=5)
        reply = json.loads(body)
        assert status == 200 and reply["status"] == "success", (expr, reply)
        return reply["data"]["result"]

    try:
        harness.wait_for(lambda: query('up{job="inferd"} == 1'), 60, "Prometheus to scrape inferd")
        missing: list[str] = []
        for title, expr in dashboard_queries():
            if "nv_gpu_" in expr and not gpu:
                continue  # the GPU panel has data on GPU hosts only; inferd exports no nv_gpu_* here

            def has_data(expr: str = expr) -> bool:
                _infer(server)  # keeps the 60 s summaries and the rates fed
                return any(sample["value"][1] != "NaN" for sample in query(expr))

            try:
                harness.wait_for(has_data, 60, f"data for {expr}", interval=0.5)
            except AssertionError:
                missing.append(f"{title}: {expr}")
        assert not missing, "queries without data:\n" + "\n".join(missing)
        # the model variable's query (label_values) through the series API Grafana uses
        status, body = harness.http_get(f"{api}/label/model/values?match[]=nv_inference_request_success")
        assert status == 200 and "add_sub" in json.loads(body)["data"]
    finally:
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(prom.pid, signal.SIGKILL)
            prom.wait(timeout=10)
