"""tritonserver command lines as inferd parses them (supervisor/flags.py, supervisor/triton_flags.py)."""

from __future__ import annotations

import re

import pytest
from inferd.supervisor import triton_flags
from inferd.supervisor.config import RESTRICTABLE
from inferd.supervisor.flags import build_parser, parse_args, parse_restrictions


def parse(tmp_path, *flags: str):
    return parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"), *flags])


def test_every_tritonserver_flag_is_known():
    known = set(build_parser()._option_string_actions)
    # tritonserver 2.51 --help, less --help itself
    triton = re.findall(r"--[a-z0-9-]+", """
    --allow-cpu-metrics --allow-gpu-metrics --allow-grpc --allow-http --allow-metrics --allow-sagemaker
    --allow-vertex-ai --backend-config --backend-directory --buffer-manager-thread-count --cache-config
    --cache-directory --cuda-memory-pool-byte-size --cuda-virtual-address-size --disable-auto-complete-config
    --enable-peer-access --exit-on-error --exit-timeout-secs --grpc-address --grpc-header-forward-pattern
    --grpc-http2-max-ping-strikes --grpc-http2-max-pings-without-data
    --grpc-http2-min-recv-ping-interval-without-data --grpc-infer-allocation-pool-size
    --grpc-infer-response-compression-level --grpc-keepalive-permit-without-calls --grpc-keepalive-time
    --grpc-keepalive-timeout --grpc-max-connection-age --grpc-max-connection-age-grace --grpc-port
    --grpc-restricted-protocol --grpc-root-cert --grpc-server-cert --grpc-server-key --grpc-use-ssl
    --grpc-use-ssl-mutual --host-policy --http-address --http-header-forward-pattern --http-port
    --http-restricted-api --http-thread-count --id --load-model --log-error --log-file --log-format --log-info
    --log-verbose --log-warning --metrics-address --metrics-config --metrics-interval-ms --metrics-port
    --min-supported-compute-capability --model-config-name --model-control-mode --model-load-gpu-limit
    --model-load-retry-count --model-load-thread-count --model-namespacing --model-repository --model-store
    --pinned-memory-pool-byte-size --rate-limit --rate-limit-resource --repoagent-directory
    --repository-poll-secs --response-cache-byte-size --reuse-grpc-port --reuse-http-port --sagemaker-port
    --sagemaker-safe-port-range --sagemaker-thread-count --strict-model-config --strict-readiness
    --trace-config --trace-count --trace-file --trace-level --trace-log-frequency --trace-rate
    --vertex-ai-default-model --vertex-ai-port --vertex-ai-thread-count""")
    assert sorted(set(triton) - known) == []


def test_inert_flags_are_reported_and_defaults_of_unsupported_ones_pass(tmp_path):
    config = parse(tmp_path, "--http-thread-count=8", "--backend-config", "python,shm-default-byte-size=1",
                   "--backend-config", "tensorrt,coalesce-request-input=true", "--rate-limit", "off",
                   "--model-namespacing=false", "--allow-sagemaker", "0")
    assert config.inert_flags == (
        "--http-thread-count=8 has no effect in inferd: " + triton_flags.INERT["--http-thread-count"],
        "--backend-config=python,shm-default-byte-size=1,tensorrt,coalesce-request-input=true has no effect "
        "in inferd: " + triton_flags.INERT["--backend-config"],
    )


def test_every_refusal_is_reported_at_once(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(tmp_path, "--rate-limit", "sometimes", "--allow-sagemaker", "true",
              "--http-header-forward-pattern", "(", "--model-load-retry-count", "-1")
    message = str(exit_info.value)
    for part in ("--rate-limit=sometimes: invalid argument for --rate-limit", "--allow-sagemaker=true",
                 "--http-header-forward-pattern", "--model-load-retry-count"):
        assert part in message


def test_restrictions_keep_the_key_as_typed_and_refuse_a_category_twice():
    assert parse_restrictions(["inference,health:Admin-Key=S3cret"], "--flag", RESTRICTABLE) == {
        "inference": ("Admin-Key", "S3cret"), "health": ("Admin-Key", "S3cret")}
    with pytest.raises(ValueError, match="restricted more than once"):
        parse_restrictions(["health:a=b", "health:c=d"], "--flag", RESTRICTABLE)
    with pytest.raises(ValueError, match="expected <categories>:<key>=<value>"):
        parse_restrictions(["health:novalue"], "--flag", RESTRICTABLE)


def test_re2_case_sensitive_prefix_is_a_valid_pattern(tmp_path):
    assert parse(tmp_path, "--grpc-header-forward-pattern", "(?-i)X-Trace.*").grpc_header_forward_pattern


def test_poll_mode_needs_a_positive_interval(tmp_path):
    with pytest.raises(SystemExit, match="--repository-poll-secs must be greater than 0"):
        parse(tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "0")


@pytest.mark.parametrize("url", ["s3://bucket/models", "gs://bucket/models", "as://account/container/models"])
def test_cloud_repositories_are_kept_as_urls_with_their_credentials(tmp_path, url):
    cfg = parse_args(["--model-repository", url + "/", "--model-repository", str(tmp_path),
                      "--run-dir", str(tmp_path / "run")], environ={"AWS_ACCESS_KEY_ID": "k", "HOME": "/h"})
    assert cfg.model_repositories == (url, str(tmp_path))
    assert cfg.cloud_credentials is not None and ("AWS_ACCESS_KEY_ID", "k") in cfg.cloud_credentials.env


def test_local_repositories_read_no_cloud_credentials(tmp_path):
    assert parse(tmp_path).cloud_credentials is None


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://host/models", "unknown storage scheme"),
    ("s3://", "missing or invalid bucket"),
    ("s3://https://nohostport/models", "expected s3://https://host:port"),
    ("as://", "expected as://account/container"),
    ("gs://bucket/../x", "'.' and '..' are not allowed"),
])
def test_bad_cloud_urls_are_refused_clearly(tmp_path, url, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        parse_args(["--model-repository", url, "--run-dir", str(tmp_path / "run")])


def test_a_malformed_cloud_credential_file_is_refused(tmp_path):
    creds = tmp_path / "creds.json"
    creds.write_text('{"s3": {"": "not an object"}}')
    with pytest.raises(SystemExit, match="TRITON_CLOUD_CREDENTIAL_PATH=.*must be an object of strings"):
        parse_args(["--model-repository", "s3://bucket/m", "--run-dir", str(tmp_path / "run")],
                   environ={"TRITON_CLOUD_CREDENTIAL_PATH": str(creds)})


def test_an_older_tritonserver_flag_is_inert(tmp_path):
    assert parse(tmp_path, "--grpc-infer-thread-count", "2").inert_flags


def test_busy_poll_defaults_to_the_machine(tmp_path):
    import os

    from inferd.supervisor.core.busy_poll import cpu_quota, default_window_us
    assert parse(tmp_path).busy_poll_us == default_window_us(len(os.sched_getaffinity(0)), cpu_quota())
    assert parse(tmp_path, "--busy-poll-us", "0").busy_poll_us == 0
    assert parse(tmp_path, "--busy-poll-us", "20000").busy_poll_us == 20000


@pytest.mark.parametrize("value", ["-1", "1000001"])
def test_busy_poll_window_is_bounded(tmp_path, value):
    with pytest.raises(SystemExit, match="--busy-poll-us must be between 0 and 1000000"):
        parse(tmp_path, "--busy-poll-us", value)


def test_rate_limit_flags(tmp_path):
    config = parse(tmp_path, "--rate-limit", "EXECUTION_COUNT", "--rate-limit-resource", "R1:10",
                   "--rate-limit-resource=R2:5:1")
    assert config.rate_limit == "execution_count"
    assert config.rate_limit_resources == (("R1", 10, None), ("R2", 5, 1))
    assert parse(tmp_path).rate_limit == "off"
    with pytest.raises(SystemExit) as exit_info:
        parse(tmp_path, "--rate-limit-resource", "R1", "--rate-limit-resource", "R2:two")
    message = str(exit_info.value)
    assert "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. " \
           "Got R1" in message
    assert "Got R2:two (count 'two' is not an integer)" in message


def test_instance_memory_limit(tmp_path):
    assert parse(tmp_path).worker.memory_limit_bytes is None  # no cap unless asked
    assert parse(tmp_path, "--instance-memory-limit", "512M").worker.memory_limit_bytes == 512 << 20
    assert parse(tmp_path, "--instance-memory-limit", "2G").worker.memory_limit_bytes == 2 << 30
    with pytest.raises(SystemExit, match="--instance-memory-limit: '12X' is not a memory size"):
        parse(tmp_path, "--instance-memory-limit", "12X")


def test_instance_recycling_flags(tmp_path):
    assert parse(tmp_path).worker.max_requests is None and parse(tmp_path).worker.max_age_s is None
    worker = parse(tmp_path, "--instance-max-requests", "10000", "--instance-max-age", "30m").worker
    assert worker.max_requests == 10000 and worker.max_age_s == 1800.0
    with pytest.raises(SystemExit, match="--instance-max-age: 'soon' is not an age"):
        parse(tmp_path, "--instance-max-age", "soon")
    with pytest.raises(SystemExit, match="--instance-max-requests: 'x' is not a request count"):
        parse(tmp_path, "--instance-max-requests", "x")
