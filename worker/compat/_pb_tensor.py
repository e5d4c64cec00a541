"""pb_utils.Tensor: host arrays, device arrays (worker/device.py) and DLPack both ways, BF16 included."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import device as _device
from .. import pb_args as _args
from ..wire import dtypes
from ._pb_base import TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_GPU, TritonModelException, _not_supported

_BF16_STORAGE = np.dtype("<u2")


def _datatype_of(array: np.ndarray) -> str:
    dt = dtypes.from_numpy(array.dtype)  # BF16 for ml_dtypes' bfloat16
    if dt is None:
        raise TritonModelException("Unsupported numpy dtype %s for a Triton tensor" % array.dtype)
    return dt.name


# numeric dtype -> protocol name, filled as models build their outputs (one dict look-up per Tensor);
# BYTES arrays (kinds O, S, U) are left to _datatype_of: their dtypes vary with the length of the items
_NUMERIC_DATATYPE: dict[np.dtype, str] = {}
_numeric_datatype = _NUMERIC_DATATYPE.get
_ndarray = np.ndarray


_DL_UINT = 1  # DLDataTypeCode kDLUInt
_DL_BFLOAT = 4  # kDLBfloat
_DLTENSOR_DTYPE_OFFSET = 20  # DLTensor: data(8) device(8) ndim(4) -> dtype {code u8, bits u8, lanes u16}


def _relabel_capsule(capsule: Any, from_code: int, to_code: int) -> bool:
    """Change the dtype code of an unconsumed 16-bit legacy DLPack capsule ("dltensor") in place:
    numpy has no bfloat16, so BF16 travels as uint16 through numpy and is relabelled at the edge.
    Returns True if the capsule had `from_code` (and was relabelled)."""
    import ctypes

    address = _device.dltensor_address(capsule)
    if not address:
        return False
    code = ctypes.c_uint8.from_address(address + _DLTENSOR_DTYPE_OFFSET)
    bits = ctypes.c_uint8.from_address(address + _DLTENSOR_DTYPE_OFFSET + 1)
    if code.value != from_code or bits.value != 16:
        return False
    code.value = to_code
    return True


class _DLPackCapsule:
    """Gives a bare DLPack capsule the `__dlpack__` protocol numpy's from_dlpack expects."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple:
        return (1, 0)


_TENSOR_SIGNATURE = "triton_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"


class Tensor:
    """`Tensor(name, numpy_array)`: a named tensor in host memory, or (from `from_dlpack` with a CUDA
    tensor, or an input that a GPU produced when FORCE_CPU_ONLY_INPUT_TENSORS is "no") in device
    memory, held as a `DeviceArray` and never copied to the host by pb_utils."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name: str, numpy_array: Any) -> None:
        if type(numpy_array) is _ndarray and type(name) is str:  # what models pass: the checks below, in short
            datatype = _numeric_datatype(numpy_array.dtype)
            if datatype is not None:
                self._name = name
                self._array = numpy_array
                self._datatype = datatype
                return
        if not isinstance(name, (str, bytes, bytearray)) or not isinstance(numpy_array, np.ndarray):
            # python_backend's binding takes (str, numpy.ndarray) only: None, lists, scalars and device
            # tensors are a TypeError there (a GPU tensor goes through Tensor.from_dlpack)
            error = _args.incompatible("__init__", _TENSOR_SIGNATURE, (name, numpy_array))
            if _device.is_device_object(numpy_array):
                error.args = (error.args[0] + "\n(use Tensor.from_dlpack for a GPU tensor)",)
            raise error
        name = _args.text(name, "Tensor name")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array
        datatype = _datatype_of(array)
        if datatype == "BF16":
            array = array.view(_BF16_STORAGE)
        elif array.dtype.kind not in "OSU" and len(_NUMERIC_DATATYPE) < 64:
            _NUMERIC_DATATYPE[array.dtype] = datatype
        self._name = name
        self._array = array
        self._datatype = datatype

    @classmethod
    def _wrap(cls, name: str, array: Any, datatype: str) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    @classmethod
    def _wrap_inputs(cls, tensors: list[Any]) -> list[Tensor]:
        """`_wrap` of each of a worker request's input tensors (backends.base.Tensor), in one call."""
        wrapped = []
        new = cls.__new__
        for t in tensors:
            tensor = new(cls)
            tensor._name = t.name
            tensor._array = t.array
            tensor._datatype = t.datatype
            wrapped.append(tensor)
        return wrapped

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if type(self._array) is _device.DeviceArray:
            raise TritonModelException(
                "Tensor '%s' is stored in GPU and cannot be converted to NumPy: use to_dlpack()" % self._name)
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor '%s' has datatype BF16, which numpy cannot represent: use to_dlpack()" % self._name
            )
        return self._array

    def shape(self) -> list[int]:
        return [int(s) for s in self._array.shape]

    def triton_dtype(self) -> int:
        return dtypes.BY_NAME[self._datatype].config_number

    def is_cpu(self) -> bool:
        return type(self._array) is not _device.DeviceArray

    def memory_type(self) -> int:
        return TRITONSERVER_MEMORY_CPU if self.is_cpu() else TRITONSERVER_MEMORY_GPU

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not support BYTES tensors ('%s')" % self._name)
        array: Any = self._array
        if type(array) is _device.DeviceArray:
            try:
                return array.to_dlpack()
            except (_device.DeviceTensorError, ImportError) as exc:
                raise TritonModelException("Tensor '%s': %s" % (self._name, exc)) from None
        if not array.flags.writeable:
            # numpy refuses to export read-only views (inputs are shared, zero-copy): hand out a copy
            array = array.copy()
        capsule = array.__dlpack__()
        if self._datatype == "BF16":  # numpy exports uint16: relabel the capsule as bfloat16
            _relabel_capsule(capsule, _DL_UINT, _DL_BFLOAT)
        return capsule

    def __dlpack_device__(self) -> tuple:
        if type(self._array) is _device.DeviceArray:
            return (_device.KDL_CUDA, self._array.device)
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with `__dlpack__` (C-contiguous). A CUDA tensor
        (torch, cupy, any CUDA DLPack producer) stays on its device, shared, not copied; bfloat16
        tensors (e.g. torch.bfloat16) become BF16 tensors."""
        name = _args.text(name, "Tensor name")
        obj = dlpack_tensor
        if isinstance(obj, Tensor):
            return Tensor._wrap(name, obj._array, obj._datatype)
        if isinstance(obj, np.ndarray):
            return Tensor(name, obj)
        if _device.is_device_object(obj):
            try:
                array = _device.from_object(obj, name)
            except _device.DeviceTensorError as exc:
                raise TritonModelException(str(exc)) from None
            return Tensor._wrap(name, array, array.datatype)
        if hasattr(obj, "__dlpack__"):
            if hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] not in (1, 3):
                raise _not_supported("Tensor.from_dlpack on a tensor of DLPack device type %d"
                                     % obj.__dlpack_device__()[0])
            capsule = obj.__dlpack__()
        else:
            capsule = obj
        device = _device.capsule_device(capsule)
        if device is not None and device[0] not in (1, 3):
            raise _not_supported("Tensor.from_dlpack on a tensor of DLPack device type %d" % device[0])
        bf16 = _relabel_capsule(capsule, _DL_BFLOAT, _DL_UINT)
        from_dlpack = getattr(np, "from_dlpack", None) or vars(np).get("_from_dlpack")
        if from_dlpack is None:
            raise _not_supported("Tensor.from_dlpack with numpy %s" % np.__version__)
        try:
            array = from_dlpack(_DLPackCapsule(capsule))
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TritonModelException("cannot import DLPack tensor '%s': %s" % (name, exc)) from None
        if not array.flags.c_contiguous:
            raise TritonModelException("DLPack tensor '%s' must be C-contiguous" % name)
        if bf16:
            return Tensor._wrap(name, array.view(_BF16_STORAGE), "BF16")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return "Tensor(%r, %s, shape=%s)" % (self._name, self._datatype, self.shape())

