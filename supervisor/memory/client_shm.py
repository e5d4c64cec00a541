"""Client-registered system shared memory (the shared-memory extension), off unless --allow-client-shm.

Regions are opened under /dev/shm by key, never through a symlink, only regular files, with offset and
size checked against the file; reads and writes are bounds-checked against the registered window.
CUDA regions (kind "cuda") are kept by memory.cuda_regions, built on the first CUDA call.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from .cuda_device import IpcDevice, probe
from .cuda_regions import CudaRegions, CudaSpan

RESERVED_PREFIX = "triton_python_backend_shm_region_"
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,255}$")
SHM_DIR = "/dev/shm"


@dataclass
class SystemRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap


def _bad(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


class ClientShm:
    def __init__(self, cuda: CudaRegions | None = None, cuda_probe: bool | None = None) -> None:
        self.system: dict[str, SystemRegion] = {}
        self.cuda = cuda if cuda is not None else CudaRegions(IpcDevice)
        # whether CUDA shared memory can work here (the cuda_shared_memory extension), judged at start
        # without importing a CUDA library
        self.cuda_available = probe() if cuda_probe is None else cuda_probe

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if kind == "cuda":
            return self.cuda.status(name)
        regions = [self.system[name]] if name else list(self.system.values())
        if name and name not in self.system:
            raise _bad("Unable to find system shared memory region: '%s'" % name)
        return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]

    def register(self, kind: str, name: str, **fields: Any) -> None:
        if kind == "cuda":
            self.cuda.device()  # without CUDA, every registration gets Triton's one answer
            if name in self.system:
                raise InferdError(ErrorCode.ALREADY_EXISTS, "shared memory region '%s' already in manager" % name)
            self.cuda.register(name, fields.get("raw_handle"), fields.get("device_id"), fields.get("byte_size"))
            return
        if name in self.cuda.regions:
            raise InferdError(ErrorCode.ALREADY_EXISTS, "shared memory region '%s' already in manager" % name)
        if not name:
            raise _bad("shared memory region name must not be empty")
        if name.startswith(RESERVED_PREFIX):
            raise _bad("cannot register shared memory region '%s': the prefix '%s' is reserved"
                       % (name, RESERVED_PREFIX))
        if name in self.system:
            raise InferdError(ErrorCode.ALREADY_EXISTS,
                              "shared memory region '%s' already in manager" % name)
        key = fields.get("key")
        offset = fields.get("offset", 0)
        byte_size = fields.get("byte_size")
        if not isinstance(key, str) or not _KEY.match(key):
            raise _bad("invalid shared memory key %r for region '%s'" % (key, name))
        for label, value in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 1 << 62:
                raise _bad("invalid %s %r for shared memory region '%s'" % (label, value, name))
        assert isinstance(offset, int) and isinstance(byte_size, int)
        if byte_size == 0:
            raise _bad("byte_size must be positive for shared memory region '%s'" % name)
        path = os.path.join(SHM_DIR, key.lstrip("/"))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise _bad("Unable to open shared memory region '%s' (key '%s'): %s" % (name, key, exc.strerror)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _bad("shared memory key '%s' is not a regular shared memory object" % key)
            if st.st_uid != os.getuid():
                raise _bad("shared memory key '%s' belongs to another user" % key)
            if offset + byte_size > st.st_size:
                raise _bad("shared memory region '%s' (offset %d + byte_size %d) exceeds the object's size %d"
                           % (name, offset, byte_size, st.st_size))
            mapping = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        self.system[name] = SystemRegion(name, key, offset, byte_size, mapping)

    def unregister(self, kind: str, name: str = "") -> None:
        if kind == "cuda":
            self.cuda.unregister(name)
            return
        if not name:
            self.system.clear()
            return
        self.system.pop(name, None)

    def _window(self, region: str, offset: int, byte_size: int) -> tuple[SystemRegion, int]:
        r = self.system.get(region)
        if r is None:
            raise _bad("Unable to find shared memory region: '%s'" % region)
        if offset < 0 or byte_size < 0 or offset + byte_size > r.byte_size:
            raise _bad("shared memory region '%s': offset %d + byte_size %d is out of bounds (size %d)"
                       % (region, offset, byte_size, r.byte_size))
        return r, r.offset + offset

    def read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> Any:
        """An input's bytes: a host copy, or for a CUDA region with `device_ok` a pinned CudaSpan."""
        if region in self.cuda.regions:
            span = self.cuda.span(region, offset, byte_size)
            return span if device_ok else self.cuda.to_host(span)
        r, start = self._window(region, offset, byte_size)
        # a copy: the client may rewrite or unregister the region while the request is queued
        return memoryview(bytes(memoryview(r.mapping)[start : start + byte_size]))

    def to_host(self, span: CudaSpan) -> memoryview:
        return self.cuda.to_host(span)

    def write(self, region: str, offset: int, data: Any) -> None:
        if region in self.cuda.regions:
            self.cuda.write(region, offset, data)
            return
        if isinstance(data, CudaSpan):  # a device input echoed to a host region
            data = self.cuda.to_host(data)
        elif hasattr(data, "share"):  # a device output for a CUDA region unregistered since
            if region in self.system:
                raise _bad("shared memory region '%s' is no longer a CUDA shared memory region" % region)
            raise _bad("Unable to find shared memory region: '%s'" % region)
        view = memoryview(data).cast("B")
        r, start = self._window(region, offset, view.nbytes)
        memoryview(r.mapping)[start : start + view.nbytes] = view
