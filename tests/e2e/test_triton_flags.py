"""A tritonserver command line starts inferd unchanged: flags for machinery inferd lacks are named
in the log as having no effect, values asking for what inferd does not do stop the start, and the
flags inferd implements do what Triton's do (log file, format and levels, CPU metrics, alternate
model configs, load retries, HTTP port reuse)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.inferd_only

INFERD = [sys.executable, "-m", "inferd.supervisor"]
TRITON_TUNING = [
    "--http-thread-count", "8", "--backend-directory", "/opt/tritonserver/backends",
    "--pinned-memory-pool-byte-size", "268435456", "--cuda-memory-pool-byte-size", "0:67108864",
    "--model-load-thread-count", "2", "--metrics-interval-ms", "1000", "--allow-gpu-metrics", "false",
    "--backend-config", "python,shm-default-byte-size=1048576", "--rate-limit", "off",
    "--model-namespacing", "false", "--trace-config", "level=OFF", "--grpc-infer-response-compression-level=none",
]
ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ \S+\] ")

FLAKY = '''
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "tried")
        if not os.path.exists(marker):  # the first load fails, the next one works
            open(marker, "w").close()
            raise RuntimeError("flaky: first attempt fails")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''


def test_triton_command_line_with_log_file_and_iso_format(server_factory, tmp_path):
    log_file = tmp_path / "server.log"
    server = server_factory(["identity_fp32"], extra_args=[*TRITON_TUNING, "--log-format", "ISO8601",
                                                           "--log-file", str(log_file)])
    text = log_file.read_text()
    assert "Started HTTPService at" in text and "Started HTTPService at" not in server.log()
    assert "--http-thread-count=8 has no effect in inferd" in text
    assert "--pinned-memory-pool-byte-size=268435456 is ignored, as tritonserver ignores it without a GPU" in text
    lines = [line for line in text.splitlines() if " inferd" in line and "] " in line]
    assert lines and all(ISO_LINE.match(line) for line in lines), lines[:5]
    assert "nv_cpu_utilization" in server.metrics()


def test_log_levels_switch_off_and_cpu_metrics_off(server_factory, tmp_path):
    log_file = tmp_path / "server.log"
    server = server_factory(["identity_fp32", "init_fail"], wait_ready=["identity_fp32"],
                            extra_args=["--log-info", "false", "--log-file", str(log_file),
                                        "--allow-cpu-metrics", "false"])
    server.wait_until(lambda: "failed to load 'init_fail'" in log_file.read_text(), 30, "the load error logged")
    heads = [line[:1] for line in log_file.read_text().splitlines() if re.match(r"^[IWE]\d{4} ", line)]
    assert "E" in heads and "I" not in heads
    assert "nv_cpu_utilization" not in server.metrics()


@pytest.mark.parametrize("args, message", [
    (["--model-namespacing", "true", "--frontend-processes", "2"], "--model-namespacing=true: frontend processes"),
    (["--rate-limit", "sometimes"], "--rate-limit=sometimes: invalid argument for --rate-limit"),
    (["--grpc-use-ssl", "true"], "--grpc-server-cert is required"),
    (["--http-restricted-api", "bogus:k=v"], "unknown category 'bogus'"),
])
def test_values_inferd_cannot_honour_stop_the_start(tmp_path, args, message):
    done = subprocess.run([*INFERD, "--model-repository", str(tmp_path), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_model_config_name_picks_the_alternate_config(server_factory):
    repo = server_factory.make_repo(["identity_fp32", "add_sub"])
    configs = repo / "identity_fp32" / "configs"
    configs.mkdir()
    text = (repo / "identity_fp32" / "config.pbtxt").read_text()
    (configs / "h100.pbtxt").write_text(text + '\nparameters { key: "variant" value: { string_value: "h100" } }\n')
    server = server_factory(repo=repo, models=["identity_fp32", "add_sub"], extra_args=["--model-config-name", "h100"])
    client = server.http_client()
    try:
        assert client.get_model_config("identity_fp32")["parameters"]["variant"]["string_value"] == "h100"
        assert "variant" not in client.get_model_config("add_sub").get("parameters", {})  # no configs/: config.pbtxt
    finally:
        client.close()


def test_a_failed_load_is_retried(server_factory):
    repo = server_factory.make_repo(["identity_fp32"])
    shutil.copytree(repo / "identity_fp32", repo / "flaky")
    (repo / "flaky" / "config.pbtxt").write_text(
        (repo / "flaky" / "config.pbtxt").read_text().replace('name: "identity_fp32"', 'name: "flaky"'))
    (repo / "flaky" / "1" / "model.py").write_text(FLAKY)
    server = server_factory(repo=repo, models=["flaky"], extra_args=["--model-load-retry-count", "1"])
    assert "flaky: first attempt fails" in server.log() and "trying again (1 of 1)" in server.log()
    assert server.model_ready("flaky")


def test_reuse_http_port_lets_a_second_server_share_the_port(server_factory, tmp_path):
    first = server_factory(["identity_fp32"], extra_args=["--reuse-http-port", "true"])
    common = [*INFERD, "--model-repository", str(first.repo), "--http-port", str(first.http_port),
              "--http-address", "127.0.0.1", "--allow-grpc", "false", "--allow-metrics", "false"]
    refused = subprocess.run(common, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "address already in use" in refused.stderr.lower(), refused.stderr
    log = tmp_path / "second.log"
    with open(log, "wb") as out:
        second = subprocess.Popen([*common, "--reuse-http-port", "true"], stdout=out, stderr=subprocess.STDOUT)
    try:
        first.wait_until(lambda: "inferd ready" in log.read_text() or second.poll() is not None, 60,
                         "the second server to start")
        assert second.poll() is None, log.read_text()
    finally:
        second.terminate()
        second.wait(timeout=30)


def test_log_settings_change_the_running_server(server_factory, tmp_path):
    log_file = tmp_path / "server.log"
    server = server_factory(["identity_fp32"], control_mode="explicit",
                            extra_args=["--log-file", str(log_file), "--log-warning", "false"])
    client = server.http_client()
    try:
        settings = client.get_log_settings()
        assert settings["log_file"] == str(log_file) and settings["log_warning"] is False
        client.update_log_settings({"log_info": False})
        client.load_model("identity_fp32")
        assert "successfully loaded 'identity_fp32'" not in log_file.read_text()
        client.update_log_settings({"log_info": True, "log_format": "ISO8601"})
        client.unload_model("identity_fp32")
        server.wait_until(lambda: "successfully unloaded 'identity_fp32'" in log_file.read_text(), 30, "the unload")
        line = next(x for x in log_file.read_text().splitlines() if "successfully unloaded" in x)
        assert ISO_LINE.match(line), line
        with pytest.raises(Exception, match="log_format must be"):
            client.update_log_settings({"log_format": "fancy"})
    finally:
        client.close()
