"""POSIX shared-memory regions, shared by the supervisor and the workers, that never outlive their creator.

- `create(stem, size)` makes a file under /dev/shm, reserves its pages with `posix_fallocate` (a full
  /dev/shm is an InferdError(UNAVAILABLE) at creation instead of a SIGBUS at the first write) and
  unlinks it at once: the creator keeps the region alive by its open fd. The region's name is a
  handle, `<stem>.<fd>.<inode>`, and `attach(handle)` opens `/proc/<owner pid>/fd/<fd>` (checking
  the inode), so no name is ever left in /dev/shm: when the creator exits, even by kill -9, the
  kernel frees the region once the last mapping is gone. An unlinked file cannot be linked back
  under a name, so no client can name (and register) one. Only the microseconds between create and
  unlink leave a name a kill -9 could strand: `sweep_stale()` removes those at the next start.
- `attach(name)` maps an existing region without `multiprocessing.shared_memory` (whose resource
  tracker unlinks segments it did not create when the attaching process exits, Python 3.11). A
  plain name (not a handle) is opened under /dev/shm, as regions made by older versions were.
- Stems are `inferd_<owner pid>_<suffix>` with only `[A-Za-z0-9_.-]`; `sweep_stale()` unlinks the
  segments whose owner is dead (or a zombie, or whose pid was reused by a later process).
- Error messages never echo region names (they are internal; see reliability D12).

Standard library + numpy-free; runs on Python 3.9+ (Linux for handles: /proc/<pid>/fd).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
import weakref
from typing import Optional

from .errors import ErrorCode, InferdError

SHM_DIR = "/dev/shm"
PREFIX = "inferd_"

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,200}\Z")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def valid_name(name: str) -> bool:
    return bool(isinstance(name, str) and _NAME_RE.match(name)) and name not in (".", "..")


def _path(name: str) -> str:
    if not valid_name(name):
        raise InferdError(ErrorCode.INVALID_ARG, "invalid shared memory region name")
    return os.path.join(SHM_DIR, name)


class Region:
    """A mapped region. `buf` is a memoryview over the whole mapping (read-only if attached so)."""

    __slots__ = ("name", "size", "readonly", "inode", "dev", "_fd", "_mmap", "buf", "__weakref__")

    def __init__(
        self, name: str, mm: mmap.mmap, size: int, readonly: bool, inode: int, dev: int = 0, fd: int = -1
    ) -> None:
        self.name = name
        self.size = size
        self.readonly = readonly
        self.inode = inode
        self.dev = dev
        self._fd = fd  # the creator's fd: what keeps an unlinked region alive and attachable
        self._mmap: Optional[mmap.mmap] = mm
        self.buf: memoryview = memoryview(mm)  # released (unusable) once closed
        _LIVE.add(self)

    @property
    def closed(self) -> bool:
        return self._mmap is None

    def close(self) -> bool:
        """Unmap (and, in the creator, close the fd: nobody can attach any more). Returns False when
        views (e.g. numpy arrays) still use the mapping: it is then unmapped by the garbage collector
        once the last of them is gone."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        mm, self._mmap = self._mmap, None
        if mm is None:
            return True
        try:
            self.buf.release()
        except BufferError:
            return False
        try:
            mm.close()
        except BufferError:
            return False
        return True

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Region(%r, size=%d%s)" % (self.name, self.size, ", closed" if self.closed else "")


# Every Region this process created or attached and still holds: the supervisor refuses these objects
# as client shared memory (a client must never read or write a pool or worker region through the API).
_LIVE: weakref.WeakSet[Region] = weakref.WeakSet()


def live_identities() -> set[tuple[int, int]]:
    """(st_dev, st_ino) of the regions this process holds (created or attached)."""
    return {(r.dev, r.inode) for r in list(_LIVE)}


def make_name(owner_pid: int, suffix: str) -> str:
    name = "%s%d_%s" % (PREFIX, int(owner_pid), suffix)
    if not valid_name(name):
        raise InferdError(ErrorCode.INVALID_ARG, "invalid shared memory region suffix %r" % suffix)
    return name


def owner_pid(name: str, prefix: str = PREFIX) -> Optional[int]:
    """The owner pid encoded in `<prefix><pid>_<suffix>`, or None if the name has another shape."""
    if not name.startswith(prefix):
        return None
    head = name[len(prefix) :].split("_", 1)[0]
    if not head.isdigit():
        return None
    return int(head)


def create(name: str, size: int) -> Region:
    """Create a new region of exactly `size` bytes and map it read/write. `name` is the stem (fails if
    it exists); the region's name is its handle `<stem>.<fd>.<inode>` (see the module docstring)."""
    path = _path(name)
    if size <= 0:
        raise InferdError(ErrorCode.INVALID_ARG, "shared memory region size must be positive")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        handle = "%s.%d.%d" % (name, fd, st.st_ino)
        try:
            # renamed first so that /proc/<pid>/maps shows the handle ("... (deleted)"), then unlinked
            os.rename(path, _path(handle))
            path = _path(handle)
        finally:
            _unlink_quietly(path)
        try:
            os.ftruncate(fd, size)
            _reserve(fd, size)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT):
                # status and words as Triton's Python backend for a pool that cannot grow (its qa greps them)
                raise InferdError(
                    ErrorCode.INTERNAL,
                    "shared memory exhausted: cannot reserve %d bytes in %s (%s). Failed to increase the shared "
                    "memory pool size; inside docker, use the '--shm-size' flag to make %s larger"
                    % (size, SHM_DIR, os.strerror(exc.errno), SHM_DIR),
                ) from None
            raise
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return Region(handle, mm, size, False, st.st_ino, st.st_dev, fd)
    except BaseException:
        os.close(fd)
        raise


def _handle(name: str) -> Optional[tuple[int, int, int]]:
    """(owner pid, fd, inode) of a handle `inferd_<pid>_<suffix>.<fd>.<inode>`; None for a plain name."""
    parts = name.rsplit(".", 2)
    pid = owner_pid(name)
    if pid is None or len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return pid, int(parts[1]), int(parts[2])


def is_handle(name: str) -> bool:
    """True for a handle `<stem>.<fd>.<inode>`: it reaches one object for ever (or nothing), never another."""
    return _handle(name) is not None


def stem(name: str) -> str:
    """The stem a region was created from (`name` itself if it is not a handle)."""
    return name.rsplit(".", 2)[0] if _handle(name) is not None else name


def _open_path(name: str) -> tuple[str, Optional[int], int]:
    """Where to open `name` (a handle: the owner's fd under /proc), the inode it must have, and O_NOFOLLOW
    where it applies (/proc fd links are followed by design; /dev/shm names never)."""
    handle = _handle(name) if valid_name(name) else None
    if handle is None:
        return _path(name), None, _O_NOFOLLOW
    pid, fd, inode = handle
    return "/proc/%d/fd/%d" % (pid, fd), inode, 0


def _same_region(st: os.stat_result, inode: int) -> bool:
    """What a handle's fd reaches is still its region: that inode, unlinked, on the /dev/shm filesystem
    (a creator that closed the region may have reused the fd number for any other file)."""
    try:
        shm_dev = os.stat(SHM_DIR).st_dev
    except OSError:
        return False
    return st.st_ino == inode and st.st_nlink == 0 and st.st_dev == shm_dev


def _reserve(fd: int, size: int) -> None:
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # not Linux: nothing to reserve with
        return
    try:
        fallocate(fd, 0, size)
    except OSError as exc:
        # Filesystems without fallocate support: the mapping still works, only unreserved.
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


def attach(name: str, readonly: bool = False) -> Region:
    """Map an existing region (by handle or by /dev/shm name). Refuses symlinks, non-regular files,
    files of another user, and a handle whose fd now holds another file (its creator closed it)."""
    path, inode, nofollow = _open_path(name)
    flags = (os.O_RDONLY if readonly else os.O_RDWR) | nofollow | _O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InferdError(ErrorCode.NOT_FOUND, "shared memory region not found") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InferdError(ErrorCode.INVALID_ARG, "shared memory region is a symlink") from None
        hint = ""
        if inode is not None and exc.errno in (errno.EACCES, errno.EPERM):
            hint = " (its owner's /proc/<pid>/fd is not readable: run every inferd process as one user)"
        raise InferdError(
            ErrorCode.UNAVAILABLE, "cannot open shared memory region: %s%s" % (os.strerror(exc.errno or 0), hint)
        ) from None
    try:
        st = os.fstat(fd)
        if inode is not None and not _same_region(st, inode):
            raise InferdError(ErrorCode.NOT_FOUND, "shared memory region not found")
        if not stat.S_ISREG(st.st_mode):
            raise InferdError(ErrorCode.INVALID_ARG, "shared memory region is not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise InferdError(ErrorCode.INVALID_ARG, "shared memory region belongs to another user")
        if st.st_size <= 0:
            raise InferdError(ErrorCode.INVALID_ARG, "shared memory region is empty")
        prot = mmap.PROT_READ if readonly else mmap.PROT_READ | mmap.PROT_WRITE
        mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, prot)
        return Region(name, mm, st.st_size, readonly, st.st_ino, st.st_dev)
    finally:
        os.close(fd)


def unlink_owned(pid: int, directory: str = SHM_DIR) -> list[str]:
    """Unlink every region named for owner `pid` (call once that process is gone)."""
    prefix = "%s%d_" % (PREFIX, int(pid))
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix) and unlink(name):
            removed.append(name)
    return removed


def unlink(name: str) -> bool:
    """Remove a region name (mappings stay valid until closed). False if it did not exist."""
    try:
        os.unlink(_path(name))
        return True
    except FileNotFoundError:
        return False


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def inode_of(name: str) -> Optional[int]:
    """Inode of the region `name` now reaches (None if none): detects a re-created name, or a handle
    whose creator closed it (a reused fd reaches another file)."""
    try:
        path, inode, nofollow = _open_path(name)
        st = os.stat(path, follow_symlinks=not nofollow)
    except (OSError, InferdError):
        return None
    if inode is not None and not _same_region(st, inode):
        return None
    return st.st_ino


# ---- stale segment sweeping ----------------------------------------------------------------


def _boot_time() -> Optional[float]:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _proc_stat(pid: int) -> Optional[list[bytes]]:
    """Fields of /proc/<pid>/stat after the `(comm)` field: [state, ppid, ...]."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    end = data.rfind(b")")
    if end < 0:
        return None
    return data[end + 1 :].split()


def pid_state(pid: int) -> str:
    """'alive', 'dead' or 'zombie' (a zombie's resources are gone: it counts as dead)."""
    if pid <= 0:
        return "dead"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        pass  # exists, belongs to another user
    fields = _proc_stat(pid)
    if fields and fields[0] in (b"Z", b"X"):
        return "zombie"
    return "alive"


def _started_after(pid: int, when: float, boot: Optional[float]) -> bool:
    """True if process `pid` started clearly after time `when` (its pid was reused)."""
    if boot is None:
        return False
    fields = _proc_stat(pid)
    if not fields or len(fields) < 20:
        return False
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        start = boot + int(fields[19]) / float(ticks)
    except (ValueError, OSError):
        return False
    return start > when + 2.0


def owner_gone(pid: int, since: float) -> bool:
    """True if the process `pid` that made something at time `since` has ended: dead, a zombie,
    or its pid now belongs to a process started after that."""
    return pid_state(pid) != "alive" or _started_after(pid, since, _boot_time())


def sweep_stale(prefix: str = PREFIX, directory: str = SHM_DIR) -> list[str]:
    """Unlink segments `<prefix><pid>_*` whose owner is dead, a zombie, or a later process that
    reuses the pid. Returns the names removed. Never touches segments of this process."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    me = os.getpid()
    boot = _boot_time()
    states: dict = {}
    for name in sorted(names):
        pid = owner_pid(name, prefix)
        if pid is None or pid == me or not valid_name(name):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        state = states.get(pid)
        if state is None:
            state = states[pid] = pid_state(pid)
        stale = state != "alive" or _started_after(pid, st.st_mtime, boot)
        if stale:
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed
