"""nv_gpu_* metrics from a fake NVML: Triton's names, HELP texts and gpu_uuid label, the values in
Triton's units, the refresh every interval on a thread of its own, readings that fail, and a stop
that does not wait on a wedged NVML call."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from inferd.supervisor import gpus
from inferd.supervisor.gpus import FakeNvml, NvmlError
from inferd.supervisor.metrics.gpu import GpuMetrics, GpuSample, render_gpu_metrics

UUID0 = "GPU-fa6e0000-0000-0000-0000-000000000000"
UUID1 = "GPU-fa6e0000-0000-0000-0000-000000000001"


class Scripted(FakeNvml):
    """Readings set by the test; `fail` names the readings that raise."""

    def __init__(self, count: int = 2) -> None:
        super().__init__(count)
        self.util = [0] * count
        self.used = [0] * count
        self.energy = [5_000_000] * count
        self.fail: set[str] = set()
        self.block: threading.Event | None = None

    def utilization(self, index: int) -> int:
        if self.block is not None:
            self.block.wait(30)
        if "utilization" in self.fail:
            raise NvmlError("nvmlDeviceGetUtilizationRates: Not Supported")
        return self.util[index]

    def memory(self, index: int) -> tuple[int, int]:
        return 80 << 30, self.used[index]

    def power_usage_mw(self, index: int) -> int:
        return 150_500 + index

    def power_limit_mw(self, index: int) -> int:
        if "power limit" in self.fail:
            raise NvmlError("nvmlDeviceGetPowerManagementLimit: Not Supported")
        return 700_000

    def energy_mj(self, index: int) -> int:
        return self.energy[index]


def _poller(nvml: Scripted, interval_s: float = 3600.0) -> GpuMetrics:
    found = gpus.discover(lambda: nvml)
    return GpuMetrics(nvml, found.gpus, interval_s)


def _values(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_names_help_types_and_labels() -> None:
    text = render_gpu_metrics([GpuSample(UUID0, 0.5, 100, 40, 150.5, 700.0, 12.5)]).decode()
    assert text == (
        "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)\n# TYPE nv_gpu_utilization gauge\n"
        f'nv_gpu_utilization{{gpu_uuid="{UUID0}"}} 0.5\n'
        "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes\n# TYPE nv_gpu_memory_total_bytes gauge\n"
        f'nv_gpu_memory_total_bytes{{gpu_uuid="{UUID0}"}} 100\n'
        "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes\n# TYPE nv_gpu_memory_used_bytes gauge\n"
        f'nv_gpu_memory_used_bytes{{gpu_uuid="{UUID0}"}} 40\n'
        "# HELP nv_gpu_power_usage GPU power usage in watts\n# TYPE nv_gpu_power_usage gauge\n"
        f'nv_gpu_power_usage{{gpu_uuid="{UUID0}"}} 150.5\n'
        "# HELP nv_gpu_power_limit GPU power management limit in watts\n# TYPE nv_gpu_power_limit gauge\n"
        f'nv_gpu_power_limit{{gpu_uuid="{UUID0}"}} 700.0\n'
        "# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started\n"
        "# TYPE nv_energy_consumption counter\n"
        f'nv_energy_consumption{{gpu_uuid="{UUID0}"}} 12.5\n')
    assert render_gpu_metrics([]) == b""


def test_values_in_tritons_units_per_gpu() -> None:
    nvml = Scripted()
    nvml.util, nvml.used = [37, 100], [1 << 30, 2 << 30]
    poller = _poller(nvml)
    assert poller.render() == b""  # nothing before the first poll
    poller.poll_once()
    v = _values(poller.render().decode())
    assert v[f'nv_gpu_utilization{{gpu_uuid="{UUID0}"}}'] == 0.37
    assert v[f'nv_gpu_utilization{{gpu_uuid="{UUID1}"}}'] == 1.0
    assert v[f'nv_gpu_memory_total_bytes{{gpu_uuid="{UUID1}"}}'] == 80 << 30
    assert v[f'nv_gpu_memory_used_bytes{{gpu_uuid="{UUID1}"}}'] == 2 << 30
    assert v[f'nv_gpu_power_usage{{gpu_uuid="{UUID1}"}}'] == 150.501
    assert v[f'nv_gpu_power_limit{{gpu_uuid="{UUID0}"}}'] == 700.0
    assert v[f'nv_energy_consumption{{gpu_uuid="{UUID0}"}}'] == 0.0  # joules since the server started
    nvml.energy[0] += 2500  # mJ
    poller.poll_once()
    nvml.energy[0] -= 10_000  # a driver reload restarts NVML's count: the counter never goes back
    poller.poll_once()
    nvml.energy[0] += 1000
    poller.poll_once()
    assert _values(poller.render().decode())[f'nv_energy_consumption{{gpu_uuid="{UUID0}"}}'] == 3.5


def test_failing_reading_is_zero_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = Scripted(1)
    nvml.util = [50]
    nvml.fail = {"power limit"}
    poller = _poller(nvml)
    with caplog.at_level(logging.WARNING, logger="inferd"):
        for _ in range(3):
            poller.poll_once()
    v = _values(poller.render().decode())
    assert v[f'nv_gpu_power_limit{{gpu_uuid="{UUID0}"}}'] == 0.0
    assert v[f'nv_gpu_utilization{{gpu_uuid="{UUID0}"}}'] == 0.5
    warned = [r.getMessage() for r in caplog.records if "power limit" in r.getMessage()]
    assert len(warned) == 1 and "GPU 0" in warned[0] and "Not Supported" in warned[0]


def test_refreshes_every_interval_on_its_own_thread() -> None:
    nvml = Scripted(1)
    poller = _poller(nvml, interval_s=0.02)
    poller.start()
    try:
        deadline = time.monotonic() + 30
        while poller.polls < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert _values(poller.render().decode())[f'nv_gpu_utilization{{gpu_uuid="{UUID0}"}}'] == 0.0
        nvml.util = [80]
        while time.monotonic() < deadline:
            if _values(poller.render().decode())[f'nv_gpu_utilization{{gpu_uuid="{UUID0}"}}'] == 0.8:
                break
            time.sleep(0.005)
        assert _values(poller.render().decode())[f'nv_gpu_utilization{{gpu_uuid="{UUID0}"}}'] == 0.8
    finally:
        assert poller.stop()


def test_a_wedged_nvml_call_blocks_neither_scrapes_nor_stop() -> None:
    nvml = Scripted(1)
    poller = _poller(nvml, interval_s=0.01)
    poller.poll_once()
    nvml.block = threading.Event()  # the next utilization read hangs, as a stuck driver would
    poller.start()
    try:
        t0 = time.monotonic()
        assert b"nv_gpu_utilization" in poller.render()  # the last snapshot, at once
        assert poller.stop(timeout_s=0.2) is False  # still inside NVML: not waited for
        assert time.monotonic() - t0 < 10
    finally:
        nvml.block.set()
    assert poller.stop(timeout_s=30)
