"""worker/current_device.py: which CUDA library makes the device current, in the documented order, and a
worker with none (a CPU environment) going on with a line that says why. The libraries are stand-in
modules here (the real ones need a GPU: tests/gpu/test_gpu_discovery.py)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from inferd.worker import current_device as cuda_device


class _Err(int):
    name = "cudaErrorInvalidDevice"


def _install(monkeypatch: pytest.MonkeyPatch, name: str, module: Any) -> None:
    parts = name.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, name, module)


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def _cudart(calls: list[int], code: int = 0) -> Any:
    mod = types.ModuleType("cuda.bindings.runtime")
    mod.cudaSetDevice = lambda d: (calls.append(d), (_Err(code),))[1]  # type: ignore[attr-defined]
    return mod


def _driver(log: list[str], device_error: int = 0) -> Any:
    mod = types.ModuleType("cuda.bindings.driver")
    mod.cuInit = lambda flags: (log.append("init"), (_Err(0),))[1]  # type: ignore[attr-defined]
    mod.cuDeviceGet = lambda d: (log.append(f"get {d}"), (_Err(device_error), f"dev{d}"))[1]  # type: ignore[attr-defined]
    mod.cuDevicePrimaryCtxRetain = lambda dev: (log.append(f"retain {dev}"), (_Err(0), f"ctx-{dev}"))[1]  # type: ignore[attr-defined]
    mod.cuCtxSetCurrent = lambda ctx: (log.append(f"current {ctx}"), (_Err(0),))[1]  # type: ignore[attr-defined]
    return mod


def _torch(calls: list[int], available: bool = True) -> Any:
    mod = types.ModuleType("torch")
    mod.__version__ = "2.x-test"  # type: ignore[attr-defined]
    mod.cuda = types.SimpleNamespace(is_available=lambda: available,  # type: ignore[attr-defined]
                                     set_device=calls.append)
    return mod


def test_cuda_python_first(monkeypatch: pytest.MonkeyPatch) -> None:
    set_by_cudart: list[int] = []
    set_by_torch: list[int] = []
    driver_calls: list[str] = []
    _install(monkeypatch, "cuda.bindings.runtime", _cudart(set_by_cudart))
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", _driver(driver_calls))
    _install(monkeypatch, "torch", _torch(set_by_torch))
    assert cuda_device.make_current(3) == "cuda-python"
    assert (set_by_cudart, set_by_torch) == ([3], [])
    # the primary context is made current at the driver level, where other runtimes see it
    assert driver_calls == ["init", "get 3", "retain dev3", "current ctx-dev3"]


def test_torch_when_cuda_python_fails_or_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    set_by_cudart: list[int] = []
    set_by_torch: list[int] = []
    _install(monkeypatch, "cuda.bindings.runtime", _cudart(set_by_cudart, code=101))
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", _driver([]))
    _install(monkeypatch, "torch", _torch(set_by_torch))
    assert cuda_device.make_current(1) == "torch"
    assert (set_by_cudart, set_by_torch) == ([1], [1])
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", _driver([], device_error=101))
    with pytest.raises(RuntimeError, match=r"cuda-python: cuDeviceGet\(2\) failed: cudaErrorInvalidDevice"):
        _install(monkeypatch, "torch", _torch([], available=False))
        cuda_device.make_current(2)
    _install(monkeypatch, "torch", _torch(set_by_torch))
    _hide(monkeypatch, "cuda.bindings.runtime", "cuda.cudart", "cuda.bindings", "cuda")
    assert cuda_device.make_current(2) == "torch"


def test_cupy_last(monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[int] = []
    _hide(monkeypatch, "cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart", "torch")
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Device=lambda d: types.SimpleNamespace(use=lambda: used.append(d)))
    _install(monkeypatch, "cupy", cupy)
    assert cuda_device.make_current(0) == "cupy" and used == [0]


def test_none_available_says_why(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _hide(monkeypatch, "cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart", "cupy")
    _install(monkeypatch, "torch", _torch([], available=False))
    with pytest.raises(RuntimeError) as exc:
        cuda_device.make_current(1)
    assert str(exc.value) == ("cuda-python: not installed; torch: torch 2.x-test sees no CUDA device; "
                              "cupy: not installed")
    assert cuda_device.make_current_or_warn(1, "m_0") == ""
    err = capsys.readouterr().err
    assert "inferd worker m_0: CUDA device 1 was not made current before initialize" in err
