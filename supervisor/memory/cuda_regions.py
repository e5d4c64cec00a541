"""Clients' CUDA shared-memory regions (the cuda_shared_memory extension): registration, status, pins.

A region is the client's cudaIpcMemHandle (64 bytes), its device and its byte_size. Registration opens the
handle in the supervisor (once per handle, however many regions name it), checks the device id against
the server's GPUs and byte_size against the allocation's real extent, with Triton's messages plus a reason.

An input in a region becomes a `CudaSpan` (handle, device, offset, nbytes) that pins its region until the
span is garbage collected (the request is done). Unregistering a pinned region takes its name away at once
(new requests get "Unable to find") and closes the mapping when the last span goes, so requests in flight
finish on memory that stays mapped; an output written after its region was unregistered fails with 400.

The client exiting does not free the memory while a mapping of it is open (CUDA IPC keeps the allocation
alive): as in Triton, its regions stay registered and usable until someone unregisters them.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from .cuda_device import HANDLE_BYTES, CudaDevice, CudaDeviceError

log = logging.getLogger("inferd.memory")

MAX_REGIONS = 1024  # a client cannot make the server hold unbounded GPU mappings
TRITON_INVALID = "failed to register shared memory region: invalid args"


def _bad(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


@dataclass(eq=False)
class CudaRegion:
    name: str
    handle: bytes
    device_id: int
    byte_size: int
    ptr: int  # base device pointer of the mapping in this process
    users: int = 0  # live spans
    registered: bool = True


class CudaSpan:
    """Part of a client's CUDA region, as the data of an input tensor: no bytes on the host. Pins the
    region while alive. `nbytes`, `handle`, `device`, `offset` (in the allocation) and `owner` are what a
    wire TensorRef with loc="cuda" carries."""

    __slots__ = ("table", "region", "offset", "nbytes", "__weakref__")

    def __init__(self, table: CudaRegions, region: CudaRegion, offset: int, nbytes: int) -> None:
        self.table = table
        self.region = region
        self.offset = offset
        self.nbytes = nbytes

    def to_host(self) -> memoryview:
        return self.table.to_host(self)

    @property
    def handle(self) -> bytes:
        return self.region.handle

    @property
    def device(self) -> int:
        return self.region.device_id

    @property
    def owner(self) -> str:
        return "client:" + self.region.name

    @property
    def ptr(self) -> int:
        return self.region.ptr + self.offset


@dataclass
class CudaRegions:
    """The table of CUDA regions; `make_device` builds the device on first use (the CUDA import)."""

    make_device: Callable[[], CudaDevice]
    regions: dict[str, CudaRegion] = field(default_factory=dict)
    _device: CudaDevice | None = None
    _device_error: str = ""
    _opened: dict[bytes, int] = field(default_factory=dict)  # handle -> regions (live or draining) using it
    _ptrs: dict[bytes, int] = field(default_factory=dict)  # handle -> its mapping's base pointer

    def device(self) -> CudaDevice:
        if self._device is None:
            if self._device_error:
                raise _bad(TRITON_INVALID)
            try:
                self._device = self.make_device()
            except CudaDeviceError as exc:
                self._device_error = str(exc)
                # Triton without a GPU answers exactly this; the reason goes to the log, once
                log.warning("CUDA shared memory is not available: %s", exc)
                raise _bad(TRITON_INVALID) from None
        return self._device

    # ---- registration ----
    def register(self, name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        device = self.device()
        if not name:
            raise _bad("'region name' is necessary to register cuda shared memory region")
        if name in self.regions:
            raise InferdError(ErrorCode.ALREADY_EXISTS, "shared memory region '%s' already in manager" % name)
        if not isinstance(raw_handle, (bytes, bytearray)) or len(raw_handle) != HANDLE_BYTES:
            raise _bad("%s: the raw handle must be a %d-byte cudaIpcMemHandle_t" % (TRITON_INVALID, HANDLE_BYTES))
        count = device.device_count()
        if type(device_id) is not int or not 0 <= device_id < count:
            raise _bad("%s: device_id %r is not a GPU of this server (it has %d)" % (TRITON_INVALID, device_id, count))
        if type(byte_size) is not int or byte_size <= 0:
            raise _bad("failed to register shared memory region '%s': invalid args: byte_size must be positive"
                       % name)
        if len(self.regions) >= MAX_REGIONS:
            raise InferdError(ErrorCode.RESOURCE_EXHAUSTED,
                              "failed to register shared memory region '%s': at most %d CUDA regions may be "
                              "registered" % (name, MAX_REGIONS))
        handle = bytes(raw_handle)
        opened_here = handle not in self._opened
        try:
            ptr = device.open(handle, device_id) if opened_here else self._ptrs[handle]
        except CudaDeviceError as exc:
            raise _bad("%s: cannot open the CUDA IPC handle on device %d (%s)" % (TRITON_INVALID, device_id, exc)) \
                from None
        extent = device.allocation_size(ptr, device_id)
        if extent is not None and byte_size > extent:
            if opened_here:
                self._close_handle(handle)
            raise _bad("failed to register shared memory region '%s': invalid args: byte_size %d exceeds the "
                       "allocation's %d bytes" % (name, byte_size, extent))
        self._opened[handle] = self._opened.get(handle, 0) + 1
        self._ptrs[handle] = ptr
        self.regions[name] = CudaRegion(name, handle, device_id, byte_size, ptr)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            r = self.regions.get(name)
            if r is None:
                raise InferdError(ErrorCode.NOT_FOUND, "Unable to find cuda shared memory region: '%s'" % name)
            chosen = [r]
        else:
            chosen = list(self.regions.values())
        return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in chosen]

    def unregister(self, name: str = "") -> None:
        for region_name in ([name] if name else list(self.regions)):
            r = self.regions.pop(region_name, None)
            if r is None:
                continue
            r.registered = False
            if r.users == 0:
                self._drop(r)
            else:
                log.info("CUDA shared memory region '%s' is closed when its %d in-flight request(s) finish",
                         r.name, r.users)

    def is_open(self, handle: bytes) -> bool:
        """Whether some region (registered or draining) still maps `handle` (workers may keep theirs)."""
        return handle in self._opened

    # ---- use by requests ----
    def window(self, name: str, offset: int, byte_size: int) -> CudaRegion:
        r = self.regions.get(name)
        if r is None:
            raise _bad("Unable to find shared memory region: '%s'" % name)
        if offset < 0 or offset >= r.byte_size:
            raise _bad("Invalid offset for shared memory region: '%s'" % name)
        if byte_size < 0 or offset + byte_size > r.byte_size:
            raise _bad("Invalid offset + byte size for shared memory region: '%s'" % name)
        return r

    def span(self, name: str, offset: int, byte_size: int) -> CudaSpan:
        """An input's bytes in region `name`, pinned until the span is collected."""
        r = self.window(name, offset, byte_size)
        span = CudaSpan(self, r, offset, byte_size)
        r.users += 1
        weakref.finalize(span, self._unpin, r)
        return span

    def to_host(self, span: CudaSpan) -> memoryview:
        """The span's bytes copied to host memory (a model on the CPU, or a path that needs host bytes)."""
        out = bytearray(span.nbytes)
        try:
            self.device().to_host(memoryview(out), span.ptr, span.device)
        except CudaDeviceError as exc:
            raise _bad("cannot read CUDA shared memory region '%s': %s" % (span.region.name, exc)) from None
        return memoryview(out)

    def write(self, name: str, offset: int, data: Any) -> None:
        """An output into region `name`: from host bytes, device to device from a CudaSpan, or device to
        device from a worker's device output (memory.device_refs.DeviceRef: hex handle in `region`)."""
        device = self.device()
        if isinstance(data, CudaSpan):
            r = self.window(name, offset, data.nbytes)
            self._copy(name, lambda: device.copy(r.ptr + offset, data.ptr, data.nbytes, r.device_id))
        elif hasattr(data, "share") and hasattr(data, "region"):
            data.share.check()  # the producer is alive: its allocation is still there
            r = self.window(name, offset, int(data.nbytes))
            self._copy(name, lambda: self._copy_from_producer(device, r.ptr + offset, data, r.device_id))
        else:
            view = memoryview(data).cast("B")
            r = self.window(name, offset, view.nbytes)
            self._copy(name, lambda: device.from_host(r.ptr + offset, view, r.device_id))

    @staticmethod
    def _copy(name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except CudaDeviceError as exc:
            raise _bad("cannot write CUDA shared memory region '%s': %s" % (name, exc)) from None

    @staticmethod
    def _copy_from_producer(device: CudaDevice, dst: int, ref: Any, dst_device: int) -> None:
        # the producer worker's pool segment, mapped here only for this copy: a mapping kept open would
        # keep a dead worker's GPU memory alive
        handle = bytes.fromhex(ref.region)
        base = device.open(handle, int(ref.device))
        try:
            device.copy(dst, base + int(ref.offset), int(ref.nbytes), dst_device)
        finally:
            device.close(handle)

    # ---- internals ----
    def _unpin(self, r: CudaRegion) -> None:
        r.users -= 1
        if r.users == 0 and not r.registered:
            self._drop(r)

    def _drop(self, r: CudaRegion) -> None:
        left = self._opened.get(r.handle, 0) - 1
        if left > 0:
            self._opened[r.handle] = left
            return
        self._opened.pop(r.handle, None)
        self._ptrs.pop(r.handle, None)
        self._close_handle(r.handle)

    def _close_handle(self, handle: bytes) -> None:
        if self._device is None:
            return
        try:
            self._device.close(handle)
        except CudaDeviceError as exc:  # the mapping is gone either way; say so and carry on
            log.warning("closing a CUDA IPC handle failed: %s", exc)
