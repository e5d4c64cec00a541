"""GPU discovery (supervisor/gpus.py) with NVML missing, failing, present with no GPU, and two fake GPUs
under the CUDA_VISIBLE_DEVICES rules; the pynvml adapter where nvidia-ml-py is installed."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from inferd.supervisor import gpus
from inferd.supervisor.gpus import FakeNvml, NvmlError


def _no_module(name: str) -> Any:
    raise ModuleNotFoundError(f"No module named '{name}'", name=name)


def test_nvml_missing_means_cpu() -> None:
    found = gpus.discover(gpus.nvml_factory(import_module=_no_module))
    assert found.gpus == () and found.nvml is None
    assert found.note == "no GPUs: nvidia-ml-py is not installed (pip install 'inferd[gpu]'); models run on CPUs"


def test_nvml_failing_to_start_means_cpu() -> None:
    found = gpus.discover(gpus.nvml_factory("error"))
    assert found.gpus == () and found.nvml is None
    assert "NVML failed to start" in found.note and "Driver Not Loaded" in found.note
    assert found.note.endswith("models run on CPUs")


def test_real_pynvml_without_a_driver_means_cpu() -> None:
    pytest.importorskip("pynvml")
    if gpus.discover(gpus.nvml_factory()).gpus:
        pytest.skip("this host has an NVIDIA GPU")
    found = gpus.discover(gpus.nvml_factory())
    assert found.gpus == () and found.note.startswith("no GPUs: ")


class _Counting(FakeNvml):
    def __init__(self, count: int, broken: tuple[int, ...] = (), count_fails: bool = False) -> None:
        super().__init__(count)
        self.broken = broken
        self.count_fails = count_fails
        self.shut = 0

    def device_count(self) -> int:
        if self.count_fails:
            raise NvmlError("nvmlDeviceGetCount: Unknown Error")
        return super().device_count()

    def uuid(self, index: int) -> str:
        if index in self.broken:
            raise NvmlError("nvmlDeviceGetUUID: GPU is lost")
        return super().uuid(index)

    def shutdown(self) -> None:
        self.shut += 1


def test_zero_gpus_means_cpu_and_nvml_is_shut_down() -> None:
    nvml = _Counting(0)
    found = gpus.discover(lambda: nvml)
    assert found.gpus == () and found.nvml is None and nvml.shut == 1
    assert found.note == "no GPUs: NVML found no GPU; models run on CPUs"
    nvml = _Counting(2, count_fails=True)
    found = gpus.discover(lambda: nvml)
    assert found.gpus == () and "cannot count the GPUs" in found.note


def test_two_fake_gpus() -> None:
    found = gpus.discover(gpus.nvml_factory("2"))
    assert found.cuda_ids == (0, 1)
    assert [(g.nvml_index, g.uuid, g.name, g.memory_total_bytes) for g in found.gpus] == [
        (0, "GPU-fa6e0000-0000-0000-0000-000000000000", "Fake GPU", 16 << 30),
        (1, "GPU-fa6e0000-0000-0000-0000-000000000001", "Fake GPU", 16 << 30)]
    assert found.note.startswith("GPUs: 0: Fake GPU GPU-fa6e") and "1: Fake GPU" in found.note
    assert found.nvml is not None and not found.warnings
    found.close()
    assert found.nvml is None


@pytest.mark.parametrize("visible, nvml_order, warned", [
    ("1", [1], False),
    ("1,0", [1, 0], False),  # CUDA numbers them in the listed order
    (" 2 , 0 ", [2, 0], False),
    ("GPU-fa6e0000-0000-0000-0000-000000000002,0", [2, 0], False),  # a UUID
    ("fa6e0000-0000-0000-0000-000000000001", [1], False),  # without GPU-
    ("0,7,1", [0], True),  # the list ends at an index that names no GPU
    ("0,0", [0], True),  # a repeat ends it too
    ("GPU-fa6e", [], True),  # a prefix that fits several GPUs names none
    ("MIG-1234", [], True),
    ("", [], False),  # hides every GPU
    ("-1", [], True),
])
def test_cuda_visible_devices(visible: str, nvml_order: list[int], warned: bool) -> None:
    found = gpus.discover(gpus.nvml_factory("3"), visible)
    assert [g.nvml_index for g in found.gpus] == nvml_order
    assert list(found.cuda_ids) == list(range(len(nvml_order)))
    assert any("CUDA_VISIBLE_DEVICES" in w for w in found.warnings) == warned
    if not nvml_order:
        assert found.note == f"no GPUs: CUDA_VISIBLE_DEVICES={visible!r} hides all 3 GPUs; models run on CPUs"


def test_a_gpu_nvml_cannot_name_is_placed_without_metrics() -> None:
    found = gpus.discover(lambda: _Counting(2, broken=(0,)))
    assert [(g.cuda_id, g.uuid) for g in found.gpus] == [(0, ""), (1, "GPU-fa6e0000-0000-0000-0000-000000000001")]
    assert any("cannot read GPU 0" in w for w in found.warnings)


def test_device_order_other_than_pci_is_warned() -> None:
    assert not gpus.discover(gpus.nvml_factory("2"), None, "PCI_BUS_ID").warnings
    found = gpus.discover(gpus.nvml_factory("2"), None, "FASTEST_FIRST")
    assert any("CUDA_DEVICE_ORDER=FASTEST_FIRST" in w for w in found.warnings)


class _FakePynvmlModule:
    """The few pynvml names PyNvml calls, to check the adapter's conversions (bytes names, mW, errors)."""

    class NVMLError(Exception):
        pass

    class _Mem:
        total, used = 80 << 30, 1 << 30

    class _Util:
        gpu = 42

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str: return f"h{i}"
    def nvmlDeviceGetUUID(self, h: str) -> bytes: return b"GPU-abc"
    def nvmlDeviceGetName(self, h: str) -> str: return "NVIDIA H100"
    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any: return self._Mem()
    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any: return self._Util()
    def nvmlDeviceGetPowerUsage(self, h: str) -> int: return 123_456
    def nvmlDeviceGetPowerManagementLimit(self, h: str) -> int: return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        raise self.NVMLError("Not Supported")


def test_pynvml_adapter() -> None:
    nv = gpus.PyNvml(_FakePynvmlModule())
    found = gpus.discover(lambda: nv)
    assert [(g.uuid, g.name, g.memory_total_bytes) for g in found.gpus] == [("GPU-abc", "NVIDIA H100", 80 << 30)]
    assert (nv.utilization(0), nv.power_usage_mw(0), nv.power_limit_mw(0), nv.memory(0)) == (
        42, 123_456, 700_000, (80 << 30, 1 << 30))
    with pytest.raises(NvmlError, match="nvmlDeviceGetTotalEnergyConsumption: Not Supported"):
        nv.energy_mj(0)


def test_cpu_paths_import_no_gpu_library() -> None:
    """The server's modules and the worker's runtime import nothing GPU: pynvml only when discovery
    runs, current_device only in a GPU instance's worker."""
    code = ("import sys, inferd.supervisor.app, inferd.supervisor.metrics.gpu, inferd.worker.message_loop\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pynvml', 'cuda', 'cupy', 'torch')"
            " or m == 'inferd.worker.current_device'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
