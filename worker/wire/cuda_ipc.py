"""CUDA IPC: export a device allocation as a 64-byte handle, open a peer's handle in place, copy.

The one place that calls the CUDA runtime for moving device tensors between processes (the shared
spec: /work/CUDA_WIRE_SPEC.md, docs/worker-protocol.md "Device tensors"). The CUDA library is
imported lazily, on first use: cuda.bindings (cuda-python) first, then cupy, then the libcudart
that torch or the nvidia-cuda-runtime wheel brings (through ctypes). A CPU-only worker that never
meets a device tensor never imports any of them.

Opening a handle costs tens of microseconds and maps the whole allocation, so each handle is opened
once per process and cached until `close_handle` (a pool's segments are reused for many tensors).
Every failure raises CudaIpcError with a message; nothing here may crash the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import Any, Optional

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction inferred from the pointers (unified addressing)


class CudaIpcError(Exception):
    """A CUDA IPC operation failed (no CUDA, a bad or foreign handle, a wrong device)."""


class _Runtime:
    """The few runtime calls this module needs, whatever library provides them. Pointers are ints."""

    name = ""

    def device_count(self) -> int:
        raise NotImplementedError

    def set_device(self, device: int) -> None:
        raise NotImplementedError

    def get_device(self) -> int:
        """The calling thread's current device (restored after each call here: the model's own)."""
        return -1

    def init_context(self) -> None:
        """Makes the current device's primary context current (cudaFree(0)); driver calls need one."""
        raise NotImplementedError

    def get_handle(self, ptr: int) -> bytes:
        raise NotImplementedError

    def open(self, handle: bytes) -> int:
        raise NotImplementedError

    def close(self, ptr: int) -> None:
        raise NotImplementedError

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def address_range(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the allocation holding `ptr`: the driver's cuMemGetAddressRange."""
        return _driver_address_range(ptr)


class _CudaBindings(_Runtime):
    """cuda-python: every call returns a tuple whose first item is the error code."""

    name = "cuda.bindings"

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver, runtime
        except ImportError:
            from cuda import cuda as driver  # type: ignore[no-redef]  # cuda-python < 12.6
            from cuda import cudart as runtime  # type: ignore[no-redef]
        self._rt: Any = runtime
        self._drv: Any = driver
        self._ok = runtime.cudaError_t.cudaSuccess

    def _check(self, result: Any, what: str) -> Any:
        err = result[0]
        if err != self._ok:
            text = self._rt.cudaGetErrorString(err)
            detail = text[1].decode() if len(text) > 1 and isinstance(text[1], bytes) else str(err)
            raise CudaIpcError("%s failed: %s" % (what, detail))
        return result[1] if len(result) == 2 else result[1:]

    def device_count(self) -> int:
        return int(self._check(self._rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))

    def set_device(self, device: int) -> None:
        self._check(self._rt.cudaSetDevice(device), "cudaSetDevice(%d)" % device)

    def get_device(self) -> int:
        return int(self._check(self._rt.cudaGetDevice(), "cudaGetDevice"))

    def init_context(self) -> None:
        self._check(self._rt.cudaFree(0), "cudaFree(0)")

    def get_handle(self, ptr: int) -> bytes:
        handle = self._check(self._rt.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
        reserved = handle.reserved  # bytes; some versions give a list of (signed) chars
        return reserved if isinstance(reserved, bytes) else bytes((b + 256) % 256 for b in reserved)

    def open(self, handle: bytes) -> int:
        value = self._rt.cudaIpcMemHandle_t()
        value.reserved = handle
        ptr = self._check(self._rt.cudaIpcOpenMemHandle(value, _LAZY_ENABLE_PEER_ACCESS), "cudaIpcOpenMemHandle")
        return int(ptr)

    def close(self, ptr: int) -> None:
        self._check(self._rt.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDefault
        self._check(self._rt.cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy")

    def synchronize(self) -> None:
        self._check(self._rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def address_range(self, ptr: int) -> tuple[int, int]:
        err, base, size = self._drv.cuMemGetAddressRange(ptr)
        if err != self._drv.CUresult.CUDA_SUCCESS:
            raise CudaIpcError("cuMemGetAddressRange failed: %s" % err)
        return int(base), int(size)


class _Cupy(_Runtime):
    """cupy.cuda.runtime: raises CUDARuntimeError itself; handles are bytes already."""

    name = "cupy"

    def __init__(self) -> None:
        from cupy.cuda import runtime

        self._rt: Any = runtime

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # cupy_backends.cuda.api.runtime.CUDARuntimeError
            raise CudaIpcError("%s failed: %s" % (what, exc)) from None

    def device_count(self) -> int:
        return int(self._call("cudaGetDeviceCount", self._rt.getDeviceCount))

    def set_device(self, device: int) -> None:
        self._call("cudaSetDevice(%d)" % device, self._rt.setDevice, device)

    def get_device(self) -> int:
        return int(self._call("cudaGetDevice", self._rt.getDevice))

    def init_context(self) -> None:
        self._call("cudaFree(0)", self._rt.free, 0)

    def get_handle(self, ptr: int) -> bytes:
        return bytes(self._call("cudaIpcGetMemHandle", self._rt.ipcGetMemHandle, ptr))

    def open(self, handle: bytes) -> int:
        return int(self._call("cudaIpcOpenMemHandle", self._rt.ipcOpenMemHandle, handle, _LAZY_ENABLE_PEER_ACCESS))

    def close(self, ptr: int) -> None:
        self._call("cudaIpcCloseMemHandle", self._rt.ipcCloseMemHandle, ptr)

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        self._call("cudaMemcpy", self._rt.memcpy, dst, src, nbytes, _MEMCPY_DEFAULT)

    def synchronize(self) -> None:
        self._call("cudaDeviceSynchronize", self._rt.deviceSynchronize)


class _CudartCtypes(_Runtime):
    """libcudart through ctypes: the library torch (or the nvidia-cuda-runtime wheel) ships."""

    name = "libcudart"

    class _Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]

    def __init__(self) -> None:
        self._lib = _load_cudart()
        lib = self._lib
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), self._Handle, ctypes.c_uint]
        lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(self._Handle), ctypes.c_void_p]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaGetErrorString.restype = ctypes.c_char_p

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            raise CudaIpcError("%s failed: %s" % (what, self._lib.cudaGetErrorString(err).decode()))

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self._check(self._lib.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount")
        return count.value

    def set_device(self, device: int) -> None:
        self._check(self._lib.cudaSetDevice(ctypes.c_int(device)), "cudaSetDevice(%d)" % device)

    def get_device(self) -> int:
        current = ctypes.c_int(0)
        self._check(self._lib.cudaGetDevice(ctypes.byref(current)), "cudaGetDevice")
        return current.value

    def init_context(self) -> None:
        self._check(self._lib.cudaFree(None), "cudaFree(0)")

    def get_handle(self, ptr: int) -> bytes:
        handle = self._Handle()
        self._check(self._lib.cudaIpcGetMemHandle(ctypes.byref(handle), ptr), "cudaIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES)

    def open(self, handle: bytes) -> int:
        value = self._Handle.from_buffer_copy(handle)
        ptr = ctypes.c_void_p(0)
        self._check(self._lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), value, _LAZY_ENABLE_PEER_ACCESS),
                    "cudaIpcOpenMemHandle")
        return int(ptr.value or 0)

    def close(self, ptr: int) -> None:
        self._check(self._lib.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self._lib.cudaMemcpy(dst, src, nbytes, _MEMCPY_DEFAULT), "cudaMemcpy")

    def synchronize(self) -> None:
        self._check(self._lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def _load_cudart() -> Any:
    """libcudart.so from torch's or the nvidia wheels' lib folder, else the loader path."""
    candidates: list[str] = []
    try:
        import torch

        candidates += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcudart.so*"))
    except ImportError:
        pass
    try:
        import nvidia.cuda_runtime as rt  # type: ignore[import-not-found]

        for folder in list(rt.__path__):
            candidates += glob.glob(os.path.join(folder, "lib", "libcudart.so*"))
    except ImportError:
        pass
    found = ctypes.util.find_library("cudart")
    candidates += [found] if found else []
    candidates += ["libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0"]
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise CudaIpcError("no CUDA runtime library (libcudart) found")


_DRIVER: Optional[Any] = None


def _driver_address_range(ptr: int) -> tuple[int, int]:
    """cuMemGetAddressRange_v2 from libcuda (the driver, present wherever a GPU is usable)."""
    global _DRIVER
    if _DRIVER is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            raise CudaIpcError("the CUDA driver (libcuda.so.1) is not loadable") from None
        lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.c_uint64]
        _DRIVER = lib
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    err = _DRIVER.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if err != 0:
        raise CudaIpcError("cuMemGetAddressRange failed (CUresult %d) for pointer 0x%x" % (err, ptr))
    return int(base.value), int(size.value)


def encode_handle(handle: bytes) -> str:
    """A handle as TensorRef.region carries it (hex)."""
    return handle.hex()


def decode_handle(region: str) -> bytes:
    """The handle in a TensorRef.region; CudaIpcError when it is not 64 hex-encoded bytes."""
    try:
        handle = bytes.fromhex(region)
    except (TypeError, ValueError):
        raise CudaIpcError("a CUDA IPC handle must be hex-encoded") from None
    if len(handle) != HANDLE_BYTES:
        raise CudaIpcError("a CUDA IPC handle is %d bytes, got %d" % (HANDLE_BYTES, len(handle)))
    return handle


# ---- the module's state: one runtime, the opened handles ---------------------------------------------

_lock = threading.RLock()
_runtime: Optional[_Runtime] = None
_runtime_error = ""
_opened: dict[bytes, tuple[int, int]] = {}  # handle -> (base pointer, device)
_initialised = threading.local()  # per thread: devices whose primary context it has made current


def _load() -> _Runtime:
    """The first runtime library that imports (once per process)."""
    global _runtime, _runtime_error
    with _lock:
        if _runtime is not None:
            return _runtime
        if _runtime_error:
            raise CudaIpcError(_runtime_error)
        reasons = []
        for kind in (_CudaBindings, _Cupy, _CudartCtypes):
            try:
                _runtime = kind()
                return _runtime
            except (ImportError, OSError, CudaIpcError, AttributeError) as exc:
                reasons.append("%s: %s" % (kind.name, exc))
        _runtime_error = "no CUDA runtime available (%s)" % "; ".join(reasons)
        raise CudaIpcError(_runtime_error)


def backend_name() -> str:
    """Which library serves the calls ("" when none could be loaded)."""
    try:
        return _load().name
    except CudaIpcError:
        return ""


class _OnDevice:
    """`with _OnDevice(rt, device):` makes `device` current for the calling thread and gives the thread
    its previous device back afterwards (the model's framework tracks its own current device)."""

    __slots__ = ("_rt", "_device", "_previous")

    def __init__(self, rt: _Runtime, device: int) -> None:
        self._rt = rt
        self._device = device
        self._previous = -1

    def __enter__(self) -> None:
        self._previous = self._rt.get_device()
        _use_device(self._rt, self._device)

    def __exit__(self, *exc: Any) -> None:
        if 0 <= self._previous != self._device:
            self._rt.set_device(self._previous)


def _use_device(rt: _Runtime, device: int) -> None:
    """Makes `device` current for this thread, its primary context initialised."""
    if type(device) is not int or device < 0:
        raise CudaIpcError("invalid CUDA device %r" % (device,))
    rt.set_device(device)
    done = getattr(_initialised, "devices", None)
    if done is None:
        done = _initialised.devices = set()
    if device not in done:  # the driver calls (cuMemGetAddressRange) need a current context on this thread
        rt.init_context()
        done.add(device)


def available() -> bool:
    """A CUDA runtime loads and at least one device is usable here."""
    try:
        return device_count() > 0
    except CudaIpcError:
        return False


def device_count() -> int:
    rt = _load()
    with _lock:
        return rt.device_count()


def open_handle(handle: bytes, device: int) -> int:
    """The base device pointer of the allocation `handle` exports, mapped into this process on
    `device` (opened once per process, cached)."""
    if type(handle) is not bytes or len(handle) != HANDLE_BYTES:
        raise CudaIpcError("a CUDA IPC handle is %d bytes, got %s" % (
            HANDLE_BYTES, len(handle) if isinstance(handle, (bytes, bytearray)) else type(handle).__name__))
    with _lock:
        hit = _opened.get(handle)
        if hit is not None:
            if hit[1] != device:
                raise CudaIpcError("CUDA IPC handle already opened on device %d, not %d" % (hit[1], device))
            return hit[0]
        rt = _load()
        with _OnDevice(rt, device):
            ptr = rt.open(handle)
        _opened[handle] = (ptr, device)
        return ptr


def close_handle(handle: bytes) -> None:
    """Unmaps a handle opened by `open_handle` (nothing if it is not open)."""
    with _lock:
        hit = _opened.pop(handle, None)
        if hit is None:
            return
        rt = _load()
        with _OnDevice(rt, hit[1]):
            rt.close(hit[0])


def opened_count() -> int:
    """How many handles this process holds open (for tests and stats)."""
    with _lock:
        return len(_opened)


def export(ptr: int, device: int) -> tuple[bytes, int]:
    """(IPC handle of the allocation holding `ptr`, `ptr`'s offset in that allocation). Waits for the
    device's pending work first: a consumer in another process sees none of this process's streams,
    so the bytes must be final before the handle leaves."""
    rt = _load()
    with _lock, _OnDevice(rt, device):
        rt.synchronize()
        base, size = rt.address_range(ptr)
        if not base <= ptr < base + max(size, 1):
            raise CudaIpcError("pointer 0x%x is outside its allocation [0x%x, +%d)" % (ptr, base, size))
        return rt.get_handle(base), ptr - base


def copy(dst: int, src: int, nbytes: int, device: int) -> None:
    """cudaMemcpy with cudaMemcpyDefault (device<->device, host<->device), synchronous."""
    if nbytes < 0:
        raise CudaIpcError("negative copy size %d" % nbytes)
    if nbytes == 0:
        return
    rt = _load()
    with _lock, _OnDevice(rt, device):
        rt.synchronize()  # the source may still be written by a kernel on a non-blocking stream (ONNX Runtime's)
        rt.memcpy(dst, src, nbytes)
        rt.synchronize()  # a device-to-device cudaMemcpy returns before the copy is done
