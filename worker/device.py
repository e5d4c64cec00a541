"""Device (GPU) tensors in a worker: what a model's CUDA tensor is to the runtime, and back.

A `DeviceArray` names C-contiguous device memory (pointer, byte size, shape, protocol datatype,
device ordinal) and keeps its owner alive: the model's torch tensor or cupy array, or the mapping of
another worker's allocation opened by CUDA IPC (wire/cuda_ipc.py). It converts, without copying, to
a torch tensor, a cupy array or a DLPack capsule, and to numpy by one device-to-host copy.

Nothing here imports torch or cupy at module level: a CPU-only worker never loads a CUDA library.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from .wire import cuda_ipc, dtypes
from .wire.messages import TensorRef

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3

# protocol datatype -> __cuda_array_interface__ typestr (BF16 travels as 16-bit ints, relabelled by torch)
_TYPESTR = {
    "BOOL": "|b1", "UINT8": "|u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "INT8": "|i1",
    "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "BF16": "<i2",
}
_TORCH_NAMES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "int8": "INT8",
    "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16", "float32": "FP32", "float64": "FP64",
    "bfloat16": "BF16",
}


# Device memory this process opened from other workers, by pointer: a model that turns such an input
# into a torch tensor and returns it unchanged gives back memory that cannot be exported again (IPC
# memory is not re-exportable); it goes on under its producer's reference instead.
_opened_views: weakref.WeakValueDictionary[int, DeviceArray] = weakref.WeakValueDictionary()


def _provenance(ptr: int, nbytes: int) -> Optional[TensorRef]:
    view = _opened_views.get(ptr)
    return view.ref if view is not None and view.nbytes == nbytes else None


class DeviceTensorError(ValueError):
    """A device tensor that cannot be used as asked (not contiguous, unsupported dtype, no library)."""


class DeviceArray:
    """C-contiguous device memory with a shape and a protocol datatype."""

    __slots__ = ("ptr", "nbytes", "shape", "datatype", "device", "ref", "_keep", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, shape: tuple[int, ...], datatype: str, device: int, keep: Any,
                 ref: Optional[TensorRef] = None) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.shape = shape
        self.datatype = datatype
        self.device = device
        self.ref = ref  # the TensorRef it was opened from (another worker's memory), else None
        self._keep = keep

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def reshape(self, shape: Any) -> DeviceArray:
        """The same memory under another shape (C order); ValueError if the sizes differ."""
        target = tuple(int(s) for s in shape)
        count, known = 1, 1
        for s in self.shape:
            count *= s
        for s in target:
            known *= s
        if known != count or any(s < 0 for s in target):
            raise ValueError("cannot reshape %s into %s" % (list(self.shape), list(target)))
        return DeviceArray(self.ptr, self.nbytes, target, self.datatype, self.device, self._keep, self.ref)

    def __getitem__(self, index: Any) -> DeviceArray:
        """Rows `start:stop` (dim 0, step 1): what splitting a batch back into requests needs."""
        if not isinstance(index, slice) or index.step not in (None, 1) or not self.shape:
            raise TypeError("a DeviceArray takes only a row slice [start:stop]")
        start, stop, _ = index.indices(self.shape[0])
        stop = max(start, stop)
        row = self.nbytes // self.shape[0] if self.shape[0] else 0
        return DeviceArray(self.ptr + start * row, (stop - start) * row, (stop - start,) + self.shape[1:],
                           self.datatype, self.device, self._keep, None if start else self.ref)

    # ---- to frameworks ----
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": _TYPESTR[self.datatype], "data": (self.ptr, False),
                "strides": None, "version": 2}

    def to_torch(self) -> Any:
        import torch

        keep = self._keep
        if (type(keep).__module__.startswith("torch") and keep.data_ptr() == self.ptr
                and tuple(keep.shape) == self.shape):
            return keep
        tensor = torch.as_tensor(self, device="cuda:%d" % self.device)  # zero-copy; holds a reference to self
        return tensor.view(torch.bfloat16) if self.datatype == "BF16" else tensor

    def to_cupy(self) -> Any:
        if self.datatype == "BF16":
            raise DeviceTensorError("cupy has no bfloat16: use torch for BF16 device tensors")
        import cupy

        with cupy.cuda.Device(self.device):
            return cupy.asarray(self)  # zero-copy; the array's memory owner is self

    def to_dlpack(self) -> Any:
        """A DLPack capsule of this memory (made by torch if present, else cupy)."""
        if "torch" in sys.modules or self.datatype == "BF16" or not _importable("cupy"):
            try:
                import torch.utils.dlpack

                return torch.utils.dlpack.to_dlpack(self.to_torch())
            except ImportError:
                if self.datatype == "BF16":
                    raise DeviceTensorError("a BF16 device tensor needs torch for DLPack") from None
        return self.to_cupy().toDlpack()

    def to_numpy(self) -> np.ndarray:
        """A host copy (numpy; BF16 as raw uint16, BYTES never lives on a device)."""
        dt = dtypes.BY_NAME[self.datatype]
        out = np.empty(self.shape, dtype=np.dtype("<u2") if dt.numpy is None else dt.numpy)
        if self.nbytes:
            cuda_ipc.copy(out.ctypes.data, self.ptr, self.nbytes, self.device)
        return out

    def __repr__(self) -> str:
        return "DeviceArray(%s, shape=%s, cuda:%d)" % (self.datatype, list(self.shape), self.device)


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    import importlib.util

    return importlib.util.find_spec(name) is not None


def is_device_object(obj: Any) -> bool:
    """True for a torch CUDA tensor, a cupy array, or anything exporting CUDA memory."""
    if isinstance(obj, DeviceArray):
        return True
    if isinstance(obj, np.ndarray):
        return False
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    device = _dlpack_device(obj)
    return device is not None and device[0] == KDL_CUDA


def _dlpack_device(obj: Any) -> Optional[tuple[int, int]]:
    if hasattr(obj, "__dlpack_device__"):
        try:
            kind, index = obj.__dlpack_device__()
            return int(kind), int(index)
        except Exception:
            return None
    return capsule_device(obj)


def dltensor_address(capsule: Any) -> int:
    """Address of the DLTensor inside an unconsumed legacy DLPack capsule ("dltensor"), else 0."""
    if type(capsule).__name__ != "PyCapsule" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return 0
    api = ctypes.pythonapi
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if not api.PyCapsule_IsValid(capsule, b"dltensor"):
        return 0
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, b"dltensor") or 0


def capsule_device(capsule: Any) -> Optional[tuple[int, int]]:
    """(device type, device id) of an unconsumed legacy DLPack capsule ("dltensor"), else None."""
    address = dltensor_address(capsule)
    if not address:
        return None
    # DLTensor: void* data (8), DLDevice {int32 device_type, int32 device_id}
    return ctypes.c_int32.from_address(address + 8).value, ctypes.c_int32.from_address(address + 12).value


def from_object(obj: Any, name: str) -> DeviceArray:
    """A DeviceArray viewing a model's device tensor (torch CUDA tensor, cupy array, object with
    `__cuda_array_interface__` or CUDA `__dlpack__`, or a CUDA DLPack capsule); no copy."""
    if isinstance(obj, DeviceArray):
        return obj
    module = type(obj).__module__
    if module.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name)
    device = _dlpack_device(obj)
    if device is None or device[0] != KDL_CUDA:
        raise DeviceTensorError("tensor '%s' is not a CUDA device tensor" % name)
    # a foreign DLPack producer: import it with a framework that keeps the producer alive
    try:
        import torch.utils.dlpack

        return _from_torch(torch.utils.dlpack.from_dlpack(obj), name)
    except ImportError:
        pass
    try:
        import cupy

        return _from_cai(cupy.from_dlpack(obj), name)
    except ImportError:
        raise DeviceTensorError("importing the CUDA DLPack tensor '%s' needs torch or cupy" % name) from None


def _from_torch(tensor: Any, name: str) -> DeviceArray:
    if not tensor.is_cuda:
        raise DeviceTensorError("tensor '%s' is not on a CUDA device" % name)
    if not tensor.is_contiguous():
        raise DeviceTensorError("DLPack tensor '%s' must be C-contiguous" % name)
    datatype = _TORCH_NAMES.get(str(tensor.dtype).replace("torch.", ""))
    if datatype is None:
        raise DeviceTensorError("tensor '%s' has the unsupported dtype %s" % (name, tensor.dtype))
    nbytes = tensor.numel() * tensor.element_size()
    ptr = int(tensor.data_ptr())
    return DeviceArray(ptr, nbytes, tuple(int(s) for s in tensor.shape), datatype, int(tensor.device.index or 0),
                       tensor, _provenance(ptr, nbytes))


def _from_cai(obj: Any, name: str) -> DeviceArray:
    cai = obj.__cuda_array_interface__
    shape = tuple(int(s) for s in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected: list[int] = []
        step = dtype.itemsize
        for dim in reversed(shape):
            expected.insert(0, step)
            step *= dim
        if any(d > 1 and s != e for d, s, e in zip(shape, strides, expected)):
            raise DeviceTensorError("DLPack tensor '%s' must be C-contiguous" % name)
    dt = dtypes.from_numpy(dtype)
    if dt is None or dt.name == "BYTES":
        raise DeviceTensorError("tensor '%s' has the unsupported dtype %s" % (name, dtype))
    count = 1
    for s in shape:
        count *= s
    device = getattr(getattr(obj, "device", None), "id", 0)
    ptr, nbytes = int(cai["data"][0]), count * dtype.itemsize
    return DeviceArray(ptr, nbytes, shape, dt.name, int(device), obj, _provenance(ptr, nbytes))


# ---- between processes -------------------------------------------------------------------------------


def clone(array: DeviceArray) -> DeviceArray:
    """A device-to-device copy in memory this process allocated (torch, else cupy)."""
    if "torch" in sys.modules or _importable("torch"):
        return from_object(array.to_torch().clone(), "clone")
    return from_object(array.to_cupy().copy(), "clone")



# What this process exported, by (hex handle, offset): a reference to its own memory that comes back
# (the same model twice in an ensemble on one instance, a BLS callee returning its input) is used in
# place, since a process cannot open its own IPC handle.
_exported: weakref.WeakValueDictionary[tuple[str, int], DeviceArray] = weakref.WeakValueDictionary()


def export(array: DeviceArray) -> tuple[str, int]:
    """(hex handle, offset) of the allocation holding `array`, for a TensorRef loc "cuda"."""
    handle, offset = cuda_ipc.export(array.ptr, array.device)
    region = cuda_ipc.encode_handle(handle)
    _exported[(region, offset)] = array
    return region, offset


def ref_key(region: str, offset: int) -> str:
    """How a producer and the supervisor name one exported tensor (for its release)."""
    return "%s:%d" % (region, offset)


class _Opened:
    """Keeps another worker's memory referenced; `on_release` runs when the last view is collected."""

    __slots__ = ("_on_release", "__weakref__")

    def __init__(self, on_release: Optional[Callable[[], None]]) -> None:
        self._on_release = on_release

    def __del__(self) -> None:
        if self._on_release is not None:
            try:
                self._on_release()
            except Exception:
                pass


def open_ref(ref: TensorRef, on_release: Optional[Callable[[], None]] = None) -> DeviceArray:
    """A DeviceArray over another worker's allocation named by a loc "cuda" TensorRef (the handle is
    opened once per process and cached by cuda_ipc)."""
    dt = dtypes.BY_NAME.get(ref.datatype)
    if dt is None or dt.itemsize == 0:
        raise DeviceTensorError("device tensor '%s' has the unsupported datatype %s" % (ref.name, ref.datatype))
    shape = tuple(int(s) for s in ref.shape)
    count = 1
    for s in shape:
        if s < 0:
            raise DeviceTensorError("device tensor '%s' has a negative dimension" % ref.name)
        count *= s
    if count * dt.itemsize != ref.nbytes or ref.offset < 0:
        raise DeviceTensorError("device tensor '%s': %d bytes do not hold shape %s of %s" % (
            ref.name, ref.nbytes, list(shape), ref.datatype))
    own = _exported.get((ref.region, ref.offset))
    if own is not None and own.nbytes == ref.nbytes:
        return DeviceArray(own.ptr, own.nbytes, shape, ref.datatype, own.device, own, None)
    base = cuda_ipc.open_handle(cuda_ipc.decode_handle(ref.region), int(ref.device))
    array = DeviceArray(base + ref.offset, ref.nbytes, shape, ref.datatype, int(ref.device), _Opened(on_release), ref)
    _opened_views[array.ptr] = array
    return array
