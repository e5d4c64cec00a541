"""EnvironmentManager: a content-addressed cache of unpacked environments shared by models and servers.

Layout under the cache dir (kept short: conda-unpack rewrites binary prefixes in place):

    <key>/              the environment (key = first 32 hex digits of the tarball's SHA-256)
    <key>.ready.json    marker: written last; its mtime is the last use (LRU eviction)
    <key>.lock          flock: one unpacker per key across threads and server processes
    .tmp/               extraction dirs, renamed atomically onto <key>/

A tarball is extracted once into .tmp, renamed into place, relocated there (conda-unpack), probed,
then marked ready. Later loads only hash (memoised by inode/size/mtime) and touch the marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from . import unpack
from .extract import Limits, extract_safely, human_bytes, open_tarball
from .unpack import EnvError

log = logging.getLogger("inferd.envs")

KEY_LEN = 32
MARKER_SUFFIX = ".ready.json"
LOCK_SUFFIX = ".lock"
TMP_DIR = ".tmp"
RECENT_USE_S = 120.0  # an env used this recently is never evicted (another server may be starting it)


def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "inferd", "envs")


@dataclass(frozen=True)
class ExecEnv:
    """A usable environment: where its python is and how to start a worker in it."""

    root: str
    key: str  # cache key ("" for an unpacked directory given directly)
    source: str
    info: Mapping[str, Any] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)  # what this resolve cost, by stage

    @property
    def python(self) -> str:
        return os.path.join(self.root, "bin", "python")

    @property
    def extra_env(self) -> dict[str, str]:
        # the env's own .pyc files are read; nothing is written into the server's worker package
        return {"CONDA_PREFIX": self.root, "PYTHONDONTWRITEBYTECODE": "1"}

    @property
    def path_prefix(self) -> tuple[str, ...]:
        return (os.path.join(self.root, "bin"),)


@contextlib.contextmanager
def _flock(path: str, mode: int) -> Iterator[bool]:
    """Hold flock(mode) on `path`; yields False when LOCK_NB was asked and the lock is busy."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def read_marker(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def sha256_file(f: IO[bytes], size: int, timeout_s: float, what: str) -> str:
    """SHA-256 of the first `size` bytes of `f` (its fstat size: a file still growing is not read on
    forever), refused when reading takes longer than `timeout_s`."""
    h = hashlib.sha256()
    deadline = time.monotonic() + timeout_s
    left = size
    while left > 0 and (chunk := f.read(min(left, 1 << 20))):
        h.update(chunk)
        left -= len(chunk)
        if time.monotonic() > deadline:
            raise EnvError("reading environment tarball %s took longer than %.0fs (%s of %s read)"
                           % (what, timeout_s, human_bytes(size - left), human_bytes(size)))
    return h.hexdigest()


def _pids_using(roots: list[str]) -> set[str]:
    """Which of `roots` some running process executes from (its /proc/<pid>/exe lies inside)."""
    found: set[str] = set()
    prefixes = [os.path.realpath(r) + os.sep for r in roots]
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            exe = os.readlink("/proc/%s/exe" % pid)
        except OSError:
            continue
        for root, prefix in zip(roots, prefixes):
            if exe.startswith(prefix):
                found.add(root)
    return found


class EnvironmentManager:
    def __init__(self, cache_dir: str, *, max_bytes: int = 20 << 30, workers: int = 2,
                 conda_unpack_timeout_s: float = 120.0, probe_timeout_s: float = 60.0,
                 base_env: Mapping[str, str] | None = None, limits: Limits | None = None,
                 hash_timeout_s: float = 600.0) -> None:
        self.cache_dir = os.path.abspath(cache_dir)
        self.max_bytes = max_bytes
        self.limits = limits or Limits()  # on each unpacked environment (and its tarball's size)
        self.hash_timeout_s = hash_timeout_s
        self.conda_unpack_timeout_s = conda_unpack_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="inferd-env")
        self._hashes: dict[tuple[int, int, int, int], str] = {}
        self._dirs: dict[tuple[str, int], dict[str, Any]] = {}
        self._in_use: dict[str, str] = {}  # model name -> env root
        self._lock = threading.Lock()

    # ---- public ----
    async def resolve(self, model: str, path: str) -> ExecEnv:
        """The environment for EXECUTION_ENV_PATH `path`, unpacked and probed (off the event loop)."""
        loop = asyncio.get_running_loop()
        env = await loop.run_in_executor(self._executor, self.resolve_sync, path)
        with self._lock:
            self._in_use[model] = env.root
        return env

    def release(self, model: str) -> None:
        with self._lock:
            self._in_use.pop(model, None)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def resolve_sync(self, path: str) -> ExecEnv:
        path = os.path.abspath(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise EnvError("EXECUTION_ENV_PATH %s does not exist" % path) from None
        except OSError as exc:
            raise EnvError("EXECUTION_ENV_PATH %s cannot be read: %s" % (path, exc.strerror)) from None
        if stat.S_ISDIR(st.st_mode):
            return self._directory_env(path, st)
        # a regular file only: a FIFO or a device would block or never end, and hold an executor thread
        with open_tarball(path, self.limits) as f:
            return self._tarball_env(path, f)

    # ---- directory envs: used in place, probed once per (path, mtime) ----
    def _directory_env(self, path: str, st: os.stat_result) -> ExecEnv:
        memo = (path, st.st_mtime_ns)
        with self._lock:
            info = self._dirs.get(memo)
        t0 = time.monotonic()
        if info is None:
            info = unpack.probe(path, path, self._base_env, self.probe_timeout_s)
            with self._lock:
                self._dirs[memo] = info
        return ExecEnv(path, "", path, info, {"probe": time.monotonic() - t0})

    # ---- tarballs: content-addressed cache ----
    def _hash(self, path: str, f: IO[bytes], st: os.stat_result) -> str:
        memo = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            digest = self._hashes.get(memo)
        if digest is None:
            try:
                digest = sha256_file(f, st.st_size, self.hash_timeout_s, path)
            except OSError as exc:
                raise EnvError("cannot read environment tarball %s: %s" % (path, exc.strerror)) from None
            with self._lock:
                self._hashes[memo] = digest
        return digest

    def _paths(self, key: str) -> tuple[str, str, str]:
        base = os.path.join(self.cache_dir, key)
        return base, base + MARKER_SUFFIX, base + LOCK_SUFFIX

    def _tarball_env(self, path: str, f: IO[bytes]) -> ExecEnv:
        t0 = time.monotonic()
        digest = self._hash(path, f, os.fstat(f.fileno()))
        key = digest[:KEY_LEN]
        root, marker, lock = self._paths(key)
        seconds = {"hash": time.monotonic() - t0}
        try:
            os.makedirs(self.cache_dir, exist_ok=True)
        except OSError as exc:
            raise EnvError("cannot create the environment cache %s: %s" % (self.cache_dir, exc.strerror)) from None
        with _flock(lock, fcntl.LOCK_SH):  # fast path: an env marked ready is complete
            info = read_marker(marker)
            if info is not None and os.path.isdir(root):
                os.utime(marker)
                seconds["total"] = time.monotonic() - t0
                return ExecEnv(root, key, path, info, seconds)
        with _flock(lock, fcntl.LOCK_EX):
            info = read_marker(marker)
            if info is None or not os.path.isdir(root):
                info = self._build(path, f, digest, root, marker, seconds)
            else:
                os.utime(marker)
        seconds["total"] = time.monotonic() - t0
        if seconds.get("extract"):
            log.info("environment %s unpacked into %s in %.2fs (Python %s, numpy %s, pyzmq %s)", path, root,
                     seconds["total"], info.get("python"), info.get("numpy"), info.get("pyzmq"))
            self.evict()
        return ExecEnv(root, key, path, info, seconds)

    def _build(self, path: str, f: IO[bytes], digest: str, root: str, marker: str,
               seconds: dict[str, float]) -> dict[str, Any]:
        """Under the key's exclusive lock: extract, rename into place, relocate, probe, mark ready."""
        unpack.remove_tree(root)  # leftovers of a crash between rename and marker
        tmp_base = os.path.join(self.cache_dir, TMP_DIR)
        os.makedirs(tmp_base, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=digest[:8] + "-", dir=tmp_base)
        try:
            t = time.monotonic()
            f.seek(0)  # the file that was hashed, not whatever the path names now
            extract_safely(path, tmp, self.limits, fileobj=f)
            seconds["extract"] = time.monotonic() - t
            top = unpack.find_root(tmp)
            unpack.env_python(top, path)  # refuse before renaming a tree without an interpreter
            os.chmod(top, 0o755)  # mkdtemp makes 0700; other users of a shared cache may run it
            os.rename(top, root)
        finally:
            unpack.remove_tree(tmp)
        try:
            t = time.monotonic()
            unpack.conda_unpack(root, path, self._base_env, self.conda_unpack_timeout_s)
            seconds["conda_unpack"] = time.monotonic() - t
            t = time.monotonic()
            info = unpack.probe(root, path, self._base_env, self.probe_timeout_s)
            seconds["probe"] = time.monotonic() - t
        except BaseException:
            unpack.remove_tree(root)
            raise
        info.update({"sha256": digest, "source": path, "bytes": unpack.tree_bytes(root),
                     "created": time.time(), "seconds": {k: round(v, 3) for k, v in seconds.items()}})
        tmp_marker = "%s.%d.tmp" % (marker, os.getpid())
        with open(tmp_marker, "w") as out:
            json.dump(info, out, indent=1)
        os.replace(tmp_marker, marker)
        return info

    # ---- the cache as a whole ----
    def entries(self) -> list[dict[str, Any]]:
        return list_entries(self.cache_dir, self._roots_in_use())

    def _roots_in_use(self) -> set[str]:
        with self._lock:
            return set(self._in_use.values())

    def evict(self) -> list[str]:
        """Remove least recently used envs not in use until the cache fits `max_bytes`."""
        return prune(self.cache_dir, max_bytes=self.max_bytes, in_use=self._roots_in_use())


def list_entries(cache_dir: str, in_use: set[str] | None = None) -> list[dict[str, Any]]:
    """Ready environments in `cache_dir`, most recently used first."""
    out: list[dict[str, Any]] = []
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return out
    roots: list[str] = []
    for name in names:
        if not name.endswith(MARKER_SUFFIX):
            continue
        key = name[: -len(MARKER_SUFFIX)]
        marker = os.path.join(cache_dir, name)
        info = read_marker(marker)
        if info is None:
            continue
        try:
            last_used = os.stat(marker).st_mtime
        except OSError:
            continue
        root = os.path.join(cache_dir, key)
        roots.append(root)
        out.append({"key": key, "path": root, "python": info.get("python"), "numpy": info.get("numpy"),
                    "pyzmq": info.get("pyzmq"), "bytes": int(info.get("bytes") or 0),
                    "source": info.get("source", ""), "last_used": last_used})
    running = _pids_using(roots)
    for entry in out:
        entry["in_use"] = entry["path"] in running or entry["path"] in (in_use or set())
    out.sort(key=lambda e: -e["last_used"])
    return out


def remove_entry(cache_dir: str, key: str) -> bool:
    """Delete one env under its exclusive lock (skipped when busy). The marker goes first."""
    root = os.path.join(cache_dir, key)
    with _flock(root + LOCK_SUFFIX, fcntl.LOCK_EX | fcntl.LOCK_NB) as got:
        if not got:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root + MARKER_SUFFIX)
        trash = os.path.join(cache_dir, TMP_DIR, "del-%s-%d" % (key, os.getpid()))
        os.makedirs(os.path.dirname(trash), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.rename(root, trash)
        unpack.remove_tree(trash)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root + LOCK_SUFFIX)
    return True


def prune(cache_dir: str, *, max_bytes: int = 0, in_use: set[str] | None = None,
          recent_s: float = RECENT_USE_S, now: float | None = None) -> list[str]:
    """Evict LRU envs not in use (by this server's models or any running process) and not used in
    the last `recent_s` seconds, until the total is at most `max_bytes` (0: evict all such)."""
    entries = list_entries(cache_dir, in_use)
    total = sum(e["bytes"] for e in entries)
    now = time.time() if now is None else now
    removed: list[str] = []
    for entry in sorted(entries, key=lambda e: e["last_used"]):
        if total <= max_bytes:
            break
        if entry["in_use"] or now - entry["last_used"] < recent_s:
            continue
        if remove_entry(cache_dir, entry["key"]):
            removed.append(entry["key"])
            total -= entry["bytes"]
            log.info("evicted environment %s (%d MB, last used %.0fs ago)", entry["key"], entry["bytes"] >> 20,
                     now - entry["last_used"])
    return removed
