"""Client-registered system shared memory (the shared-memory extension), off unless --allow-client-shm.

Regions are opened under /dev/shm by key, never through a symlink, only regular files, with offset and
size checked against the file; reads and writes are bounds-checked against the registered window.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

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
    def __init__(self) -> None:
        self.system: dict[str, SystemRegion] = {}

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if kind == "cuda":
            if name:
                raise _bad("Unable to find cuda shared memory region: '%s'" % name)
            return []
        regions = [self.system[name]] if name else list(self.system.values())
        if name and name not in self.system:
            raise _bad("Unable to find system shared memory region: '%s'" % name)
        return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]

    def register(self, kind: str, name: str, **fields: Any) -> None:
        if kind == "cuda":
            raise InferdError(ErrorCode.UNSUPPORTED, "CUDA shared memory is not available: no GPU on this server")
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

    def read(self, region: str, offset: int, byte_size: int) -> memoryview:
        r, start = self._window(region, offset, byte_size)
        # a copy: the client may rewrite or unregister the region while the request is queued
        return memoryview(bytes(memoryview(r.mapping)[start : start + byte_size]))

    def write(self, region: str, offset: int, data: Any) -> None:
        view = memoryview(data).cast("B")
        r, start = self._window(region, offset, view.nbytes)
        memoryview(r.mapping)[start : start + view.nbytes] = view
