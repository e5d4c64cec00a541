"""The vllm backend's KIND_GPU device (worker/backends/vllm.py): an instance's GPU number is CUDA's under the
server's CUDA_VISIBLE_DEVICES, and the engine's processes get that one GPU (no GPU needed to check it)."""

from __future__ import annotations

import pytest
from inferd.worker.backends import vllm
from inferd.worker.wire.errors import InferdError


@pytest.mark.parametrize(("visible", "device", "expected"), [(None, 1, "1"), ("", 0, "0"), ("2,3", 1, "3"),
                                                              ("GPU-abc, GPU-def", 0, "GPU-abc")])
def test_instance_gpu_is_the_entry_of_the_inherited_list(monkeypatch, visible, device, expected) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert vllm._visible_device(device) == expected


def test_gpu_outside_the_list_is_refused_naming_it(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with pytest.raises(InferdError, match="GPU 1 is not among CUDA_VISIBLE_DEVICES=5"):
        vllm._visible_device(1)


def test_the_worker_leaves_the_device_to_the_engine() -> None:
    assert vllm.VllmBackend.owns_device is True  # (the runtime makes no CUDA context of its own for it)
