"""The environment tarball unpacker (supervisor/envs/extract.py `extract_safely`, EXECUTION_ENV_PATH).

Each input is a tarball (built from the bytes, or given whole) unpacked into a fresh destination inside a
scratch directory that also holds a victim file and a folder beside the destination. Invariants:
- only EnvError (the unpacker's own error, a load error naming the cause) escapes;
- nothing outside the destination changes: the scratch directory (all of it but the destination) is the same
  before and after, down to the victim's content, inode, link count and times;
- when the unpacking succeeds: every entry of the destination is a directory, a regular file or a symlink,
  and every symlink resolves (by the kernel's rules, each link followed) inside the destination.

The unpacking runs confined: the process chroot()s into the scratch directory for the call and back out
after it (root; elsewhere a forked child in a user namespace does it, or the input is skipped), so that an
unpacker that does let a member escape cannot touch anything beyond the scratch directory.

Data: one mode byte, then
- 0: a tarball's bytes (seeds: the member list of a real conda-pack environment, contents emptied, made
  by fuzz/seeds/unpack_seeds.py; and hostile ones);
- 1: members built from the bytes: directories, files, symlinks, hard links, FIFOs and devices; names from
  short and 240-character components, "." and "..", doubled and trailing slashes, names of earlier
  members; link targets from earlier names, ".." runs and the victim's path; the CVE-2025-4517 ladder
  (long directories each reached through a short symlink, then a link back up past PATH_MAX) as one
  step; ustar, GNU or PAX headers; plain or gzip; sometimes cut short.
"""

from __future__ import annotations

import bz2  # noqa: F401  (tarfile imports its compressors lazily: done here, before any chroot)
import ctypes
import gzip
import io
import json
import lzma  # noqa: F401
import os
import shutil
import stat
import tarfile
import tempfile
import zlib  # noqa: F401
from collections.abc import Callable, Iterator
from typing import Any

from _fdp import FDP, provider
from inferd.supervisor.envs.errors import EnvError
from inferd.supervisor.envs.extract import Limits, extract_safely

MAX_LEN = 32768
LIMITS = Limits(max_bytes=1 << 20, max_members=512)
EXTRACT: Callable[..., None] = lambda tarball, dest: extract_safely(tarball, dest, LIMITS)  # noqa: E731
_jail = ""  # the scratch directory: / while unpacking
_skipped = [0]


class Finding(AssertionError):
    pass


def setup() -> None:
    global _jail
    _jail = tempfile.mkdtemp(prefix="unpack-fuzz-")
    os.makedirs(os.path.join(_jail, "parent", "outside"))
    with open(os.path.join(_jail, "parent", "victim.txt"), "w") as f:
        f.write("the victim\n")
    with open(os.path.join(_jail, "parent", "outside", "data"), "w") as f:
        f.write("outside\n")


# ---- confinement ----------------------------------------------------------------------------------------

def _in_jail(fn: Callable[[], Any]) -> Any:
    """fn() with `_jail` as the root directory: in this process when root (then chroot back out through a
    descriptor of the real root), else in a forked child in a new user namespace; None if neither works."""
    if os.geteuid() == 0:
        real_root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.chroot(_jail)
            os.chdir("/")
            try:
                return fn()
            finally:
                os.fchdir(real_root)
                os.chroot(".")
                os.fchdir(cwd)
        finally:
            os.close(real_root)
            os.close(cwd)
    return _in_child(fn)


def _in_child(fn: Callable[[], Any]) -> Any:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.close(read_end)
            uid, gid = os.geteuid(), os.getegid()
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
                os._exit(4)
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            os.chroot(_jail)
            os.chdir("/")
            result = fn()
            os.write(write_end, json.dumps(["ok", result]).encode())
            code = 0
        except EnvError as exc:
            os.write(write_end, json.dumps(["env", exc.message]).encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as a finding
            os.write(write_end, json.dumps(["raised", repr(exc)]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WEXITSTATUS(status) == 4 or not text:
        _skipped[0] += 1
        return None
    kind, value = json.loads(text)
    if kind == "env":
        raise EnvError(value)
    if kind == "raised":
        raise Finding(f"the unpacker raised {value}")
    return value


# ---- what the scratch directory holds -------------------------------------------------------------------

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _tree(fd: int, prefix: str = "") -> Iterator[tuple[str, os.stat_result, int]]:
    """(relative path, lstat, fd of its directory) of everything below the directory `fd`, walked through
    descriptors (never by path: an unpacked tree may be deeper than PATH_MAX), links not followed."""
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        yield prefix + entry.name, st, fd
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(entry.name, _DIR, dir_fd=fd)
            try:
                yield from _tree(sub, prefix + entry.name + "/")
            finally:
                os.close(sub)


def snapshot() -> dict[str, tuple[Any, ...]]:
    """The scratch directory but the destination: per path its type, inode, links, size, times, mode and
    content (or link target)."""
    out = {}
    fd = os.open(_jail, _DIR)
    try:
        for rel, st, dir_fd in _tree(fd):
            if rel == "parent/dest" or rel.startswith("parent/dest/"):
                continue
            name = rel.rsplit("/", 1)[-1]
            entry: tuple[Any, ...] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_nlink, st.st_size, st.st_mtime_ns,
                                      stat.S_IMODE(st.st_mode))
            if stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(name, dir_fd=dir_fd),)
            elif stat.S_ISREG(st.st_mode):
                rfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
                with os.fdopen(rfd, "rb") as f:
                    entry += (f.read(4096),)
            out[rel] = entry
    finally:
        os.close(fd)
    return out


def _lookup(root_fd: int, comps: list[str]) -> tuple[os.stat_result, str] | None:
    """lstat (and link target) of `comps` below `root_fd`, every directory on the way entered without
    following links; None where a step is missing or not a directory."""
    fd = os.dup(root_fd)
    try:
        for comp in comps[:-1]:
            nfd = os.open(comp, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
        st = os.lstat(comps[-1], dir_fd=fd)
        return st, os.readlink(comps[-1], dir_fd=fd) if stat.S_ISLNK(st.st_mode) else ""
    except (FileNotFoundError, NotADirectoryError, OSError):
        return None
    finally:
        os.close(fd)


def _resolves_inside(root_fd: int, rel: str) -> bool:
    """Whether the symlink at `rel` resolves, by the kernel's rules, to a path inside the directory `root_fd`
    (a loop, an absolute target or a step above it: no)."""
    pending, done, hops = list(reversed(rel.split("/"))), [], 0
    while pending:
        comp = pending.pop()
        if comp in ("", "."):
            continue
        if comp == "..":
            if not done:
                return False
            done.pop()
            continue
        found = _lookup(root_fd, done + [comp])
        if found is None or not stat.S_ISLNK(found[0].st_mode):
            done.append(comp)
            continue
        hops += 1
        if hops > 40 or found[1].startswith("/"):
            return False
        pending.extend(reversed(found[1].split("/")))
    return True


def _inspect(dest: str) -> list[str]:
    """What is wrong inside an unpacked destination."""
    bad = []
    fd = os.open(dest, _DIR)
    try:
        for rel, st, _dir_fd in _tree(fd):
            mode = st.st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                bad.append(f"{rel[:80]} is of type {stat.S_IFMT(mode):o}")
            elif stat.S_ISLNK(mode) and not _resolves_inside(fd, rel):
                bad.append(f"symlink {rel[:80]} does not resolve inside (a loop, absolute, or above it)")
            elif stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                bad.append(f"{rel[:80]} is setuid/setgid")
    finally:
        os.close(fd)
    return bad


def check_tarball(blob: bytes) -> None:
    if not _jail:
        setup()
    parent = os.path.join(_jail, "parent")
    dest = os.path.join(parent, "dest")
    shutil.rmtree(dest, ignore_errors=True)
    os.mkdir(dest, 0o700)
    with open(os.path.join(_jail, "in.tar"), "wb") as f:
        f.write(blob)
    before = snapshot()

    def unpack() -> list[str]:
        EXTRACT("/in.tar", "/parent/dest")
        return _inspect("/parent/dest")

    raised: BaseException | None = None
    try:
        bad = _in_jail(unpack)
    except EnvError:
        bad = []
    except Exception as exc:  # noqa: BLE001 - a finding, reported after the escape check (the worse one)
        bad, raised = [], exc
    after = snapshot()
    shutil.rmtree(dest, ignore_errors=True)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        for extra in set(after) - set(before):  # put the scratch directory back for the next input
            path = os.path.join(_jail, extra)
            if os.path.lexists(path) and not os.path.isdir(path):
                os.unlink(path)
        shutil.rmtree(_jail, ignore_errors=True)
        setup()
        raise Finding(f"the unpacking changed what lies outside its destination: {changed[:8]}")
    if raised is not None:
        raise raised
    if bad:
        raise Finding(f"the unpacked environment holds: {bad[:5]}")


# ---- tarballs from the bytes ----------------------------------------------------------------------------

_COMPS = ["a", "b", "bin", "lib", "python", "site-packages", "x.py", ".", "..", "", "d" * 240, "l" * 254,
          "victim.txt", "outside", "pyvenv.cfg", "é"]
_TYPES = [tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE,
          tarfile.BLKTYPE, tarfile.CONTTYPE, tarfile.AREGTYPE]


def _name(fdp: FDP, names: list[str]) -> str:
    if names and fdp.ConsumeBool():
        base = fdp.PickValueInList(names)
        return base + "/" + fdp.PickValueInList(_COMPS) if fdp.ConsumeBool() else base
    parts = [fdp.PickValueInList(_COMPS) for _ in range(fdp.ConsumeIntInRange(1, 3))]
    return ("./" if fdp.ConsumeIntInRange(0, 5) == 0 else "") + "/".join(parts)


def _target(fdp: FDP, names: list[str]) -> str:
    base = fdp.PickValueInList(names) if names and fdp.ConsumeBool() else fdp.PickValueInList(_COMPS)
    ups = fdp.ConsumeIntInRange(0, 20)
    tail = fdp.PickValueInList(["", "victim.txt", "outside", "outside/data", "parent/victim.txt", "a"])
    return "/".join(p for p in [base] + [".."] * ups + [tail] if p) or "."


def _ladder(fdp: FDP, infos: list[tuple[tarfile.TarInfo, bytes]], names: list[str]) -> None:
    """CVE-2025-4517's ladder: a/b/c/... short links to long directories, a link back up from the end of it
    (past PATH_MAX on disk when long enough), and maybe a link that climbs through it."""
    steps = fdp.PickValueInList([1, 2, 8, 15, 16, 17, 20])
    comp = "d" * fdp.PickValueInList([16, 240, 250])
    path = ""
    for i in range(steps):
        d = tarfile.TarInfo(path + comp)
        d.type = tarfile.DIRTYPE
        link = tarfile.TarInfo(path + "abcdefghijklmnopqrstuvwxyz"[i])
        link.type, link.linkname = tarfile.SYMTYPE, comp
        infos += [(d, b""), (link, b"")]
        path += comp + "/"
    short = "/".join("abcdefghijklmnopqrstuvwxyz"[:steps])
    last = tarfile.TarInfo(short + "/" + "l" * fdp.PickValueInList([200, 254]))
    last.type, last.linkname = tarfile.SYMTYPE, "/".join([".."] * steps)
    infos.append((last, b""))
    names += [short, last.name]
    if fdp.ConsumeBool():  # lexically inside ("l.../.." cancel out), on disk above the destination
        up = tarfile.TarInfo(fdp.PickValueInList(["escape", "bin", "e/x"]))
        tail = fdp.PickValueInList(["", "parent", "parent/outside", "parent/victim.txt"])
        up.type = tarfile.SYMTYPE
        up.linkname = "/".join([last.name] + [".."] * (steps + fdp.ConsumeIntInRange(0, 2)) + ([tail] if tail else []))
        infos.append((up, b""))
        names.append(up.name)


def built(fdp: FDP) -> bytes:
    infos: list[tuple[tarfile.TarInfo, bytes]] = []
    names: list[str] = []
    for _ in range(fdp.ConsumeIntInRange(1, 12)):
        if not fdp.remaining_bytes():
            break
        if fdp.ConsumeIntInRange(0, 9) == 0:
            _ladder(fdp, infos, names)
            continue
        info = tarfile.TarInfo(_name(fdp, names))
        info.type = fdp.PickValueInList(_TYPES)
        info.mode = fdp.PickValueInList([0o644, 0o755, 0o4755, 0o777, 0o000, 0o2644])
        info.mtime = fdp.PickValueInList([0, 1_700_000_000, -1, 2**33])
        data = b""
        if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            data = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
            info.size = len(data)
        elif info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            info.linkname = _target(fdp, names)
        elif info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            info.devmajor, info.devminor = 1, 3
        infos.append((info, data))
        names.append(info.name.rstrip("/"))
    fmt = fdp.PickValueInList([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
    out = io.BytesIO()
    try:
        with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
            for info, data in infos:
                tar.addfile(info, io.BytesIO(data) if data or info.isreg() else None)
    except (ValueError, tarfile.TarError, OverflowError):
        return b""  # a name or value this header format cannot hold: nothing to unpack
    blob = out.getvalue()
    if fdp.ConsumeIntInRange(0, 7) == 0:
        blob = gzip.compress(blob, mtime=0)
    if fdp.ConsumeIntInRange(0, 9) == 0:
        blob = blob[:fdp.ConsumeIntInRange(0, len(blob))]
    return blob


def test_one_input(data: bytes) -> None:
    if not data:
        return
    check_tarball(data[1:] if data[0] % 2 == 0 else built(provider(data[1:])))
