"""Client-registered system shared memory (the shared-memory extension), off unless --allow-client-shm.

Regions are opened under /dev/shm by key, never through a symlink, only regular files of this user, with
offset and size checked against the file. An object the server or its workers created is refused by its
identity (st_dev, st_ino), whatever name reaches it (see `server_created`).

A client's object may shrink, vanish or be rewritten at any time, so the server never maps it: a mapped
page past a shrunk end is a SIGBUS that kills the process, and checking the size first is racy (the
client can truncate between the check and the copy). Instead the registered fd is kept open and tensors
are copied with pread/pwrite: past the end the kernel returns a short count, never a fault. It costs more
than a memcpy from a mapping (bench/client_shm_copy.py measures how much), the price of a copy no client
can turn into a crash.

CUDA regions (kind "cuda") are kept by memory.cuda_regions, built on the first CUDA call.

A request holds every region it names (`hold`, system or CUDA) from the moment it is read until it is
done: the frontends tie a `ShmHold` to the request (and to what writes its outputs), and it lets go when
the last of those goes. Unregistering a held region is refused, as Triton 2.51 refuses it ("Cannot
unregister shared memory region '<name>', it is currently in use."); unregistering all of a kind removes
the free ones and names the held ones. Offsets and sizes are read as Triton reads them, as unsigned
64-bit numbers (a negative one over gRPC is a huge one), and checked with its two messages ("Invalid
offset for shared memory region", "Invalid offset + byte size for shared memory region").
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

from .cuda_device import IpcDevice, probe
from .cuda_regions import CudaRegions, CudaSpan

RESERVED_PREFIX = "triton_python_backend_shm_region_"
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,255}$")
SHM_DIR = "/dev/shm"
MAX_SYSTEM_REGIONS = 1024  # each holds an fd open
_MAX_IO = 1 << 30  # bytes per pread/pwrite call (Linux moves at most ~2 GiB per call)
_PRECHECK_MIN = 1 << 20  # reads from this size fstat first (~1 µs) before allocating


@dataclass
class SystemRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int


def _bad(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


def check_window(name: str, size: int, offset: int, byte_size: int) -> None:
    """Triton's bounds check of (offset, byte_size) in a region of `size` bytes, with its messages. Triton
    reads both as unsigned 64-bit numbers, so a negative one (gRPC's int64) is a huge one: out of bounds."""
    if offset < 0 or offset >= size:
        raise _bad("Invalid offset for shared memory region: '%s'" % name)
    if byte_size < 0 or offset + byte_size > size:
        raise _bad("Invalid offset + byte size for shared memory region: '%s'" % name)


class ShmHold:
    """The regions one request names, held until it is done (released explicitly or when collected)."""

    __slots__ = ("_owner", "names", "__weakref__")

    def __init__(self, owner: ClientShm, names: tuple[str, ...]) -> None:
        self._owner: ClientShm | None = owner
        self.names = names

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._release(self.names)

    def __del__(self) -> None:
        self.release()


def server_created(st: os.stat_result, directory: str = SHM_DIR) -> bool:
    """True if the object `st` describes is one the server or its workers created: one this process has
    mapped (its pool regions, the workers' output and BLS regions it attached), or one that any
    `inferd_<pid>_*` name under `directory` holds (a worker's region not yet seen here). Compared by
    identity, so a hard link under another name is still ours. A worker region renamed away before the
    supervisor first maps it escapes both; its bytes are then the client's anyway (same user)."""
    ident = (st.st_dev, st.st_ino)
    if ident in shm.live_identities():
        return True
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    for entry in names:
        if shm.owner_pid(entry) is None:
            continue
        try:
            other = os.stat(os.path.join(directory, entry), follow_symlinks=False)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == ident:
            return True
    return False


class ClientShm:
    def __init__(self, cuda: CudaRegions | None = None, cuda_probe: bool | None = None) -> None:
        self.system: dict[str, SystemRegion] = {}
        self.cuda = cuda if cuda is not None else CudaRegions(IpcDevice)
        self.users: dict[str, int] = {}  # region name -> requests holding it (ShmHold)
        # whether CUDA shared memory can work here (the cuda_shared_memory extension), judged at start
        # without importing a CUDA library
        self.cuda_available = probe() if cuda_probe is None else cuda_probe

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if kind == "cuda":
            return self.cuda.status(name)
        if name and name not in self.system:  # NOT_FOUND (HTTP 404), as Triton answers it
            raise InferdError(ErrorCode.NOT_FOUND, "Unable to find system shared memory region: '%s'" % name)
        regions = [self.system[name]] if name else list(self.system.values())
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
        if len(self.system) >= MAX_SYSTEM_REGIONS:
            raise _bad("cannot register shared memory region '%s': %d system regions are registered already"
                       " (the limit)" % (name, MAX_SYSTEM_REGIONS))
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
            if server_created(st):
                raise _bad("cannot register shared memory region '%s': key '%s' is an object created by this"
                           " server" % (name, key))
            if offset + byte_size > st.st_size:
                raise _bad("shared memory region '%s' (offset %d + byte_size %d) exceeds the object's size %d"
                           % (name, offset, byte_size, st.st_size))
        except BaseException:
            os.close(fd)
            raise
        self.system[name] = SystemRegion(name, key, offset, byte_size, fd)

    def unregister(self, kind: str, name: str = "", held_too: bool = False) -> None:
        """Unregister one region (or all of `kind`); a region a request holds is refused as Triton 2.51
        refuses it, unless `held_too` (a frontend process following the core's registry)."""
        table: dict[str, Any] = self.cuda.regions if kind == "cuda" else self.system
        names = [name] if name else sorted(table)
        held = [] if held_too else [n for n in names if self.users.get(n) and n in table]
        free = [n for n in names if n not in held]
        if kind == "cuda":
            for each in free:
                self.cuda.unregister(each)
        else:
            for each in free:
                region = self.system.pop(each, None)
                if region is not None:
                    os.close(region.fd)
        if held and name:
            raise InferdError(ErrorCode.INTERNAL,
                              "Cannot unregister shared memory region '%s', it is currently in use." % name)
        if held:  # Triton's wording, separators included
            raise InferdError(ErrorCode.INTERNAL, "Failed to unregister the following %s shared memory regions: %s"
                              % ("cuda" if kind == "cuda" else "system", "".join(n + " ," for n in held)))

    # ---- requests in flight ----
    def hold(self, names: Any) -> ShmHold | None:
        """Hold the registered regions among `names` until the returned hold is released or collected."""
        cuda = self.cuda.regions
        held = tuple({n: None for n in names if n in self.system or n in cuda})
        if not held:
            return None
        users = self.users
        for n in held:
            users[n] = users.get(n, 0) + 1
        return ShmHold(self, held)

    def _release(self, names: tuple[str, ...]) -> None:
        users = self.users
        for n in names:
            left = users.get(n, 0) - 1
            if left > 0:
                users[n] = left
            else:
                users.pop(n, None)

    def check(self, region: str, offset: int, byte_size: int) -> None:
        """Triton's checks of a tensor's window in a region, made when the request is read (outputs too)."""
        r = self.system.get(region)
        if r is not None:
            check_window(region, r.byte_size, offset, byte_size)
            return
        c = self.cuda.regions.get(region)
        if c is None:  # NOT_FOUND (HTTP 404) as Triton answers a tensor naming an unknown region
            raise InferdError(ErrorCode.NOT_FOUND, "Unable to find shared memory region: '%s'" % region)
        check_window(region, c.byte_size, offset, byte_size)

    def _window(self, region: str, offset: int, byte_size: int) -> tuple[SystemRegion, int]:
        r = self.system.get(region)
        if r is None:  # NOT_FOUND (HTTP 404) as Triton answers a tensor naming an unknown region
            raise InferdError(ErrorCode.NOT_FOUND, "Unable to find shared memory region: '%s'" % region)
        check_window(region, r.byte_size, offset, byte_size)
        return r, r.offset + offset

    @staticmethod
    def _shrunk(r: SystemRegion, end: int) -> InferdError:
        try:
            now = "%d bytes" % os.fstat(r.fd).st_size
        except OSError as exc:
            now = "unreadable (%s)" % exc.strerror
        return _bad("shared memory region '%s' (key '%s') shrank after it was registered: %d bytes needed,"
                    " the object is now %s" % (r.name, r.key, end, now))

    def read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> Any:
        """An input's bytes: a host copy, or for a CUDA region with `device_ok` a pinned CudaSpan."""
        if region in self.cuda.regions:
            span = self.cuda.span(region, offset, byte_size)
            return span if device_ok else self.cuda.to_host(span)
        r, start = self._window(region, offset, byte_size)
        end = start + byte_size
        if byte_size == 0:
            return memoryview(b"")
        try:
            # a large read checks the size first only to spare allocating for an object already shrunk; a
            # truncate racing the copy is caught by the short count (a regular file reads short only at its end)
            if byte_size >= _PRECHECK_MIN and os.fstat(r.fd).st_size < end:
                raise self._shrunk(r, end)
            if byte_size <= _MAX_IO:
                data = os.pread(r.fd, byte_size, start)
                if len(data) != byte_size:
                    raise self._shrunk(r, end)
                return memoryview(data)
            buf = bytearray(byte_size)
            view, done = memoryview(buf), 0
            while done < byte_size:
                got = os.preadv(r.fd, [view[done : done + _MAX_IO]], start + done)
                if got <= 0:
                    raise self._shrunk(r, end)
                done += got
            return memoryview(buf).toreadonly()
        except OSError as exc:
            raise _bad("cannot read shared memory region '%s': %s" % (region, exc.strerror)) from None

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
        end = start + view.nbytes
        try:
            # pwrite past the end would grow the client's object again: refuse instead (a truncate racing
            # this check only makes the object grow back, never faults)
            if os.fstat(r.fd).st_size < end:
                raise self._shrunk(r, end)
            done = 0
            while done < view.nbytes:
                wrote = os.pwrite(r.fd, view[done : done + _MAX_IO], start + done)
                if wrote <= 0:
                    raise self._shrunk(r, end)
                done += wrote
        except OSError as exc:
            raise _bad("cannot write shared memory region '%s': %s" % (region, exc.strerror)) from None
