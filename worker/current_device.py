"""Make a GPU instance's CUDA device current in its worker, before the model's `initialize`.

Imported only by workers of KIND_GPU instances: a CPU worker's environment needs numpy and pyzmq
only. The device is set through the first CUDA library the worker's environment has: cuda-python
(`cuda.bindings`, or `cuda.cuda`/`cuda.cudart` before cuda-python 12.6.1), then torch, then cupy.
Each makes the device's primary context current on the calling thread, which is where every CUDA
runtime in the process reads its current device from. The id is CUDA's ordinal in the worker,
which inherits the server's CUDA_VISIBLE_DEVICES and counts in PCI bus order (supervisor/gpus.py).

Best effort, as Triton's Python backend never refuses a model for this: a worker whose environment
has none of the libraries (so the model cannot use one either), or where setting fails, logs why
and goes on to `initialize`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def _cuda_python(new: str, old: str) -> Any:
    try:
        return importlib.import_module(new)
    except ImportError:
        return importlib.import_module(old)  # cuda-python before 12.6.1


def _checked(what: str, result: Any) -> Any:
    """cuda-python returns (error, values...): the values, or RuntimeError naming the error."""
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(err) != 0:  # CUDA_SUCCESS / cudaSuccess
        raise RuntimeError("%s failed: %s" % (what, getattr(err, "name", err)))
    return values[0] if len(values) == 1 else values


def _with_cuda_python(device_id: int) -> None:
    driver = _cuda_python("cuda.bindings.driver", "cuda.cuda")
    cudart = _cuda_python("cuda.bindings.runtime", "cuda.cudart")
    # The device's primary context current on this thread at the driver level: every CUDA runtime in
    # the process (cuda-python's, torch's, cupy's) takes its current device from it.
    _checked("cuInit", driver.cuInit(0))
    device = _checked("cuDeviceGet(%d)" % device_id, driver.cuDeviceGet(device_id))
    context = _checked("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(device))
    _checked("cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
    _checked("cudaSetDevice(%d)" % device_id, cudart.cudaSetDevice(device_id))


def _with_torch(device_id: int) -> None:
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        raise RuntimeError("torch %s sees no CUDA device" % getattr(torch, "__version__", "?"))
    torch.cuda.set_device(device_id)


def _with_cupy(device_id: int) -> None:
    cupy = importlib.import_module("cupy")
    cupy.cuda.Device(device_id).use()


SETTERS: tuple[tuple[str, Callable[[int], None]], ...] = (
    ("cuda-python", _with_cuda_python),
    ("torch", _with_torch),
    ("cupy", _with_cupy),
)


def make_current(device_id: int) -> str:
    """Set the calling thread's CUDA device; the library that did it. Raises RuntimeError naming what
    each library said when none could."""
    tried = []
    for name, setter in SETTERS:
        try:
            setter(device_id)
            return name
        except ImportError:
            tried.append("%s: not installed" % name)
        except Exception as exc:  # a library present but failing (no driver, bad ordinal...): try the next
            tried.append("%s: %s" % (name, str(exc) or type(exc).__name__))
    raise RuntimeError("; ".join(tried))


def make_current_or_warn(device_id: int, instance_name: str) -> str:
    """`make_current`, or a line on stderr (the server log) saying why not; '' then."""
    try:
        return make_current(device_id)
    except RuntimeError as exc:
        print("inferd worker %s: CUDA device %d was not made current before initialize (%s)"
              % (instance_name, device_id, exc), file=sys.stderr, flush=True)
        return ""
