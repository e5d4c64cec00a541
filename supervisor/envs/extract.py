"""Safe extraction of an environment tarball (EXECUTION_ENV_PATH) into a fresh directory.

Judging member names lexically is not enough, nor is tarfile's `data` filter before Python 3.11.13
(CVE-2025-4517): symlinks whose names stay inside on paper can resolve outside on disk once long
directory names push realpath() past PATH_MAX, and a later member then writes through them. So tarfile
only reads here; every member is written by this module: each directory on a member's way is opened
relative to its parent with O_NOFOLLOW (a parent that is a symlink on disk is refused), the member itself
is created with O_EXCL | O_NOFOLLOW, a hard link must name a regular file extracted before it, and every
symlink must resolve inside once all members are out. The member count and the files' total size are
capped from the headers before anything is written, and the size again by the bytes actually written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TypeVar

from .errors import EnvError

_T = TypeVar("_T")
_CHUNK = 1 << 20
_MAX_LINK_HOPS = 40  # the kernel's MAXSYMLINKS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Limits:
    """Caps on one unpacked environment (--env-unpack-max-gb, --env-unpack-max-files). A conda-pack env
    with CUDA PyTorch is 5-10 GiB in 30,000-60,000 files; the tarball itself may be no larger either."""

    max_bytes: int = 16 << 30
    max_members: int = 500_000


def human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return "%.1f %s" % (n / (1 << shift), unit)
    return "%d bytes" % n


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _require_regular(path: str, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    kind = next((what for test, what in _KINDS if test(st.st_mode)), "not a regular file")
    raise EnvError("EXECUTION_ENV_PATH %s is %s: name a conda-pack tarball (a regular file) or an unpacked "
                   "environment (a directory)" % (path, kind))


def open_tarball(path: str, limits: Limits) -> IO[bytes]:
    """`path` opened for reading, once it is known to be a regular file no larger than the cap. A FIFO
    would block the open, /dev/zero would never end: stat() first so that no device is ever opened, then
    O_NONBLOCK so that one swapped in meanwhile cannot block, and fstat() of what was opened decides."""
    try:
        _require_regular(path, os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise EnvError("cannot read environment tarball %s: %s" % (path, exc.strerror)) from None
    try:
        st = os.fstat(fd)
        _require_regular(path, st)
        if st.st_size > limits.max_bytes:
            raise EnvError("environment tarball %s is %s, more than the %s an environment may unpack to "
                           "(--env-unpack-max-gb)" % (path, human_bytes(st.st_size), human_bytes(limits.max_bytes)))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _unsafe_reason(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if "\0" in name or "\0" in member.linkname:  # (a PAX header can hold one; no file name can)
        return "member %r has a NUL byte in its name or link target" % name
    if name.startswith("/") or posixpath.isabs(name):
        return "absolute path %r" % name
    parts = name.split("/")
    if ".." in parts:
        return "path %r leaves the environment ('..')" % name
    if member.isdev() or member.isfifo():
        return "device or fifo %r" % name
    if member.issym():
        target = member.linkname
        if posixpath.isabs(target):
            return "symlink %r points to the absolute path %r" % (name, target)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if resolved == ".." or resolved.startswith("../"):
            return "symlink %r -> %r leaves the environment" % (name, target)
    if member.islnk():
        target = member.linkname
        if posixpath.isabs(target) or ".." in target.split("/"):
            return "hard link %r -> %r leaves the environment" % (name, target)
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "unsupported member type for %r" % name
    return None


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def _members(f: IO[bytes]) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Each member in turn. tarfile keeps every member it read in a list (~500 bytes each); nothing here
    looks one up by name, so the list is emptied as it goes and memory stays flat."""
    with tarfile.open(fileobj=f, mode="r:*") as tar:
        kept = getattr(tar, "members", None)
        while (member := tar.next()) is not None:
            if isinstance(kept, list):
                kept.clear()
            yield tar, member


def _too_many(tarball: str, limits: Limits) -> EnvError:
    return EnvError("environment tarball %s has more than %d members, the most an environment may have "
                    "(--env-unpack-max-files)" % (tarball, limits.max_members))


def _too_big(tarball: str, limits: Limits) -> EnvError:
    return EnvError("environment tarball %s unpacks to more than %s, the most an environment may take "
                    "(--env-unpack-max-gb)" % (tarball, human_bytes(limits.max_bytes)))


def _scan(f: IO[bytes], tarball: str, limits: Limits) -> None:
    """First pass, headers only: the caps and the lexical checks, before a byte is written."""
    total = 0
    reason: str | None = None
    venv = False
    for count, (_tar, member) in enumerate(_members(f), 1):
        if count > limits.max_members:
            raise _too_many(tarball, limits)
        if member.isreg():
            total += member.size
            if total > limits.max_bytes:
                raise _too_big(tarball, limits)
        venv = venv or _parts(member.name) == ["pyvenv.cfg"]
        reason = reason or _unsafe_reason(member)
    if reason is not None:
        hint = ""
        if venv:
            hint = (" (this looks like a venv-pack tarball: a venv is not self-contained, its python is a link "
                    "to the interpreter it was created from; build the environment with conda-pack instead)")
        raise EnvError("refusing environment tarball %s: %s%s" % (tarball, reason, hint))


def _file_mode(mode: int) -> int:
    """As tarfile's data filter: no setuid/setgid/sticky, no group/other write, owner may read and write."""
    mode = (mode & 0o755) | 0o600
    return mode if mode & 0o100 else mode & ~0o111


def _set_mtime(fd: int, mtime: float) -> None:
    with contextlib.suppress(OSError, OverflowError, ValueError):
        ns = int(mtime * 1e9)
        os.utime(fd, ns=(ns, ns))  # .pyc files are checked against their source's mtime


class _Writer:
    """Second pass: writes the members into `dest`, never through a symlink."""

    def __init__(self, tarball: str, dest: str, limits: Limits) -> None:
        self.tarball = tarball
        self.dest = dest
        self.limits = limits
        self.written = 0
        self.dirs: list[tuple[list[str], int, float]] = []
        self.symlinks: list[str] = []
        self.root_fd = -1
        self._last: tuple[tuple[str, ...], int] | None = None  # the last parent opened (members come by folder)

    def run(self, f: IO[bytes]) -> None:
        self.root_fd = os.open(self.dest, _DIR_FLAGS)
        try:
            for count, (tar, member) in enumerate(_members(f), 1):
                if count > self.limits.max_members:
                    raise _too_many(self.tarball, self.limits)
                self._member(tar, member)
            for name in self.symlinks:
                self._check_symlink(name)
            for parts, mode, mtime in reversed(self.dirs):  # children first: a read-only dir is set last
                fd = self._walk(self.root_fd, parts, "directory %r" % "/".join(parts), create=False)
                try:
                    os.fchmod(fd, (mode & 0o755) | 0o700)
                    _set_mtime(fd, mtime)
                finally:
                    os.close(fd)
        finally:
            if self._last is not None:
                os.close(self._last[1])
            os.close(self.root_fd)

    def _refuse(self, message: str) -> EnvError:
        return EnvError("refusing environment tarball %s: %s" % (self.tarball, message))

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        reason = _unsafe_reason(member)  # the first pass checked the same bytes: this is a second guard
        if reason is not None:
            raise self._refuse(reason)
        parts = _parts(member.name)
        if member.isdir():
            if parts:
                os.close(self._walk(self.root_fd, parts, "member %r" % member.name, create=True))
                self.dirs.append((parts, member.mode, member.mtime))
            return
        if not parts:
            raise self._refuse("member %r has no name" % member.name)
        parent = self._parent(parts, member.name)
        leaf = parts[-1]
        if member.isreg():
            self._file(tar, member, parent, leaf)
        elif member.issym():
            self._replace(parent, leaf, member.name, lambda: os.symlink(member.linkname, leaf, dir_fd=parent))
            self.symlinks.append("/".join(parts))
        else:  # hard link (_unsafe_reason refused every other type)
            self._hard_link(member, parent, leaf)

    def _enter(self, fd: int, comp: str, where: str, label: str, create: bool) -> int:
        try:
            return os.open(comp, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise self._refuse("%s: %r does not exist" % (label, where)) from None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            link = stat.S_ISLNK(os.lstat(comp, dir_fd=fd).st_mode)
            raise self._refuse("%s: %r is %s on disk (nothing is written through a link)"
                               % (label, where, "a symlink" if link else "not a directory")) from None
        os.mkdir(comp, 0o700, dir_fd=fd)
        return os.open(comp, _DIR_FLAGS, dir_fd=fd)

    def _walk(self, start: int, comps: list[str], label: str, create: bool, above: tuple[str, ...] = ()) -> int:
        """An fd of the directory `comps` below `start` (itself at `above`), each step opened without
        following links; `label` names the member in errors."""
        fd = os.dup(start)
        try:
            for i, comp in enumerate(comps):
                nfd = self._enter(fd, comp, "/".join((*above, *comps[:i + 1])), label, create)
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _parent(self, parts: list[str], name: str) -> int:
        """The (cached) fd of the member's parent. A directory once made is never replaced by this writer,
        so an fd opened earlier still names the right directory."""
        key = tuple(parts[:-1])
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        if last is not None and key[:len(last[0])] == last[0]:
            fd = self._walk(last[1], list(key[len(last[0]):]), "member %r" % name, True, last[0])
        else:
            fd = self._walk(self.root_fd, list(key), "member %r" % name, True)
        if last is not None:
            os.close(last[1])
        self._last = (key, fd)
        return fd

    def _replace(self, parent: int, leaf: str, name: str, make: Callable[[], _T]) -> _T:
        """make() the entry; an earlier member of that name is replaced (as tar does), a directory is not."""
        try:
            return make()
        except FileExistsError:
            if stat.S_ISDIR(os.lstat(leaf, dir_fd=parent).st_mode):
                raise self._refuse("member %r would replace a directory" % name) from None
            os.unlink(leaf, dir_fd=parent)
            return make()

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, leaf: str) -> None:
        src = tar.extractfile(member)
        assert src is not None  # a regular member always has a body
        fd = self._replace(parent, leaf, member.name, lambda: os.open(leaf, _FILE_FLAGS, 0o600, dir_fd=parent))
        sparse = member.sparse is not None  # its holes stay holes on disk, as tarfile leaves them
        with open(fd, "wb", closefd=True) as out:
            while chunk := src.read(_CHUNK):
                self.written += len(chunk)  # holes count too: the cap is on the size the files claim
                if self.written > self.limits.max_bytes:
                    raise _too_big(self.tarball, self.limits)
                if sparse and chunk.count(0) == len(chunk):
                    out.seek(len(chunk), os.SEEK_CUR)
                else:
                    out.write(chunk)
            if sparse:
                out.truncate()  # a hole at the end: the size is where the writing stopped
            out.flush()
            os.fchmod(fd, _file_mode(member.mode))
            _set_mtime(fd, member.mtime)

    def _hard_link(self, member: tarfile.TarInfo, parent: int, leaf: str) -> None:
        target = _parts(member.linkname)
        if not target:
            raise self._refuse("hard link %r has no target" % member.name)
        tfd = self._walk(self.root_fd, target[:-1], "hard link %r -> %r" % (member.name, member.linkname), False)
        try:
            try:
                st: os.stat_result | None = os.lstat(target[-1], dir_fd=tfd)
            except FileNotFoundError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise self._refuse("hard link %r -> %r: the target is not a regular file extracted before it"
                                   % (member.name, member.linkname))
            self._replace(parent, leaf, member.name, lambda: os.link(
                target[-1], leaf, src_dir_fd=tfd, dst_dir_fd=parent, follow_symlinks=False))
        finally:
            os.close(tfd)

    def _check_symlink(self, name: str) -> None:
        """Resolve the link as the kernel would, strictly (a path past PATH_MAX or a loop is refused, not
        guessed at as non-strict realpath() does), with `dest` as a boundary it may not cross. A link
        that dangles is resolved by name past the first missing step (nothing is created afterwards)."""
        pending = list(reversed(name.split("/")))
        done: list[str] = []
        hops = 0
        while pending:
            comp = pending.pop()
            if comp in ("", "."):
                continue
            if comp == "..":
                if not done:
                    raise self._refuse("symlink %r resolves outside the environment" % name)
                done.pop()
                continue
            path = os.path.join(self.dest, *done, comp)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                done.append(comp)
                continue
            except OSError as exc:
                raise self._refuse("symlink %r cannot be resolved: %s" % (name, exc.strerror)) from None
            if not stat.S_ISLNK(st.st_mode):
                done.append(comp)
                continue
            hops += 1
            target = os.readlink(path)
            if hops > _MAX_LINK_HOPS or target.startswith("/"):
                raise self._refuse("symlink %r resolves %s" % (
                    name, "through too many links" if hops > _MAX_LINK_HOPS else "to an absolute path"))
            pending.extend(reversed(target.split("/")))


def extract_safely(tarball: str, dest: str, limits: Limits | None = None, fileobj: IO[bytes] | None = None) -> None:
    """Extract `tarball` (or the already opened `fileobj`, read from its current position) into `dest`, a
    fresh directory, under `limits`. Raises EnvError naming the cause; `dest` may then hold a partial tree
    that the caller removes."""
    limits = limits or Limits()
    try:
        with contextlib.ExitStack() as stack:
            f = fileobj if fileobj is not None else stack.enter_context(open_tarball(tarball, limits))
            start = f.tell()
            _scan(f, tarball, limits)
            f.seek(start)
            _Writer(tarball, dest, limits).run(f)
    except EnvError:
        raise
    # (OverflowError: tarfile's PAX parser on a record length beyond any index, found by fuzzing)
    except (tarfile.TarError, EOFError, zlib.error, OverflowError) as exc:
        raise EnvError("environment tarball %s is corrupt or truncated: %s: %s"
                       % (tarball, type(exc).__name__, exc)) from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise EnvError("no space left on device while unpacking environment %s into %s: %s"
                           % (tarball, os.path.dirname(dest), exc.strerror)) from None
        raise EnvError("unpacking environment %s failed: %s" % (tarball, exc)) from None
