"""BLS replies as the model sees them: an error, or named arrays.

Outputs up to the inline limit arrive as frames; larger ones as supervisor leases that the model sees
as numpy views without a copy, the lease going back (BlsRelease) when the last array viewing it is
garbage collected; a callee's own output region is copied (without holding the GIL) and given back at
once; a device output is opened in place by its CUDA IPC handle, unless it is this worker's own memory.

Runs on Python 3.9+ (numpy, stdlib only).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from . import bulk_copy, tensors
from .wire import bytes_codec, dtypes, shm
from .wire.errors import ErrorCode, InferdError
from .wire.messages import BlsResponse, TensorRef


class BlsReply:
    """One response as the model sees it: named numpy arrays (views of leases when large), or an error."""

    __slots__ = ("outputs", "error", "parameters", "final")

    def __init__(self, outputs: list[tuple[str, str, np.ndarray]], error: Optional[InferdError],
                 parameters: dict[str, Any], final: bool) -> None:
        self.outputs = outputs
        self.error = error
        self.parameters = parameters
        self.final = final


class ReplyReader:
    def __init__(self, lock: threading.RLock, own_device: weakref.WeakValueDictionary[tuple[str, int], Any],
                 release_now: Callable[[int], None], release_later: Callable[[int], None]) -> None:
        self._lock = lock  # the client's: its socket thread and synchronous callers share the mappings
        self._regions: dict[str, shm.Region] = {}  # supervisor regions mapped for outputs (under _lock)
        self._own_device = own_device  # device inputs of calls in flight (bls.BlsClient._device_input)
        self._release_now = release_now  # a lease back to the supervisor (raises when the worker is closing)
        self._release_later = release_later  # the same, quiet (from finalizers)

    def read(self, message: BlsResponse, data: Sequence[Any]) -> BlsReply:
        """One BlsResponse as the model sees it."""
        error = None
        if message.error is not None:
            try:
                code = ErrorCode(message.error.code)
            except ValueError:
                code = ErrorCode.INTERNAL
            error = InferdError(code, message.error.message)
        outputs = []
        for ref, lease in zip(message.outputs, message.leases):
            outputs.append((ref.name, ref.datatype, self.array(ref, data, lease)))
        return BlsReply(outputs, error, message.parameters or {}, bool(message.final))

    def array(self, ref: TensorRef, data: Sequence[Any], lease: int) -> Any:
        shape = tuple(int(d) for d in ref.shape)
        if ref.loc == "cuda":  # a device output: opened in place; the lease returns when the last view goes
            from . import device
            from .wire.cuda_ipc import CudaIpcError

            own = self._own_device.get((ref.region, ref.offset))
            if own is not None and own.nbytes == ref.nbytes:
                if lease:
                    self._release_later(lease)
                return own.reshape(shape)
            try:
                return device.open_ref(ref, (lambda: self._release_later(lease)) if lease else None)
            except (CudaIpcError, device.DeviceTensorError) as exc:
                if lease:
                    self._release_later(lease)
                raise InferdError(ErrorCode.INTERNAL, "BLS output '%s' (device memory of instance '%s'): %s"
                                  % (ref.name, ref.owner, exc)) from None
        if ref.loc == "frame":
            buf = data[ref.frame].buffer if hasattr(data[ref.frame], "buffer") else memoryview(data[ref.frame])
        elif tensors.worker_owned(ref.region):
            # the callee's output region, passed on by the supervisor: our own copy (copied without
            # holding the GIL), then the region goes back to its owner at once
            lent = shm.attach(ref.region, readonly=True)
            try:
                if ref.offset < 0 or ref.nbytes < 0 or ref.offset + ref.nbytes > lent.size:
                    raise InferdError(ErrorCode.INTERNAL, "BLS output lies outside its shared memory region")
                with lent.buf[ref.offset: ref.offset + ref.nbytes] as view:
                    buf = bulk_copy.private_copy(view)
            finally:
                lent.close()
                if lease:
                    self._release_now(lease)
            lease = 0
        else:
            with self._lock:  # the socket thread and synchronous callers share the mappings
                region = self._regions.get(ref.region)
                if region is None:
                    if len(self._regions) >= 32:  # drop the oldest mapping (unmapped once unused)
                        old = next(iter(self._regions))
                        self._regions.pop(old).close()
                    region = self._regions[ref.region] = shm.attach(ref.region)
                buf = region.buf[ref.offset: ref.offset + ref.nbytes]
        if ref.datatype == "BYTES":
            count = int(np.prod(shape)) if shape else 1
            array = bytes_codec.deserialize(buf, count=count, name=ref.name).reshape(shape)
            if lease:
                self._release_now(lease)  # decoded into Python objects: done
            return array
        dt = dtypes.BY_NAME.get(ref.datatype)
        if dt is None or dt.numpy is None:
            raise InferdError(ErrorCode.INTERNAL, "unsupported BLS output datatype %s" % ref.datatype)
        root = np.frombuffer(buf, dtype=dt.numpy)
        if lease:
            # every view made from `root` keeps it alive: the lease returns when the last one is gone
            weakref.finalize(root, self._release_later, lease)
        return root.reshape(shape)
