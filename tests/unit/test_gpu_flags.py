"""The GPU settings of the frozen config: --allow-gpu-metrics, --metrics-interval-ms, and the environment
variables read in flags.py only (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, the test-only fake GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from inferd.supervisor import config as config_mod
from inferd.supervisor.flags import parse_args


def _parse(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> config_mod.ServerConfig:
    return parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"), *flags],
                      environ=env or {})


def test_defaults(tmp_path: Path) -> None:
    cfg = _parse(tmp_path)
    assert (cfg.allow_gpu_metrics, cfg.metrics_interval_ms) == (True, 2000.0)
    assert (cfg.cuda_visible_devices, cfg.cuda_device_order, cfg.test_only_fake_gpus) == (None, None, "")


def test_gpu_metric_flags(tmp_path: Path) -> None:
    cfg = _parse(tmp_path, "--allow-gpu-metrics=false", "--metrics-interval-ms", "250")
    assert (cfg.allow_gpu_metrics, cfg.metrics_interval_ms) == (False, 250.0)
    with pytest.raises(SystemExit, match="--metrics-interval-ms must be greater than 0"):
        _parse(tmp_path, "--metrics-interval-ms", "0")


def test_environment_is_read_here(tmp_path: Path) -> None:
    cfg = _parse(tmp_path, env={"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
                                config_mod.TEST_ONLY_FAKE_GPUS_ENV: "2"})
    assert (cfg.cuda_visible_devices, cfg.cuda_device_order, cfg.test_only_fake_gpus) == ("", "FASTEST_FIRST", "2")
    with pytest.raises(SystemExit, match="INFERD_TEST_ONLY_FAKE_GPUS=two: expected a number of GPUs"):
        _parse(tmp_path, env={config_mod.TEST_ONLY_FAKE_GPUS_ENV: "two"})
