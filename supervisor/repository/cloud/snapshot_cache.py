"""A cloud repository served from local copies: each model is copied once per content change.

    <cache_dir>/<sha1(repository url)[:16]>/<model>/
        <fingerprint>/<model>/...   one complete copy (a "snapshot"), served as a local model directory
        <fingerprint>/manifest.json the objects it was made of (key, size, etag)
        .tmp-<pid>-*/               a copy being made; renamed onto <fingerprint>/ only once every file
                                    is there with the size the listing announced

The fingerprint digests the model's object list (keys, sizes, ETags), so a change to any object (a new
version directory, an edited config) makes a new snapshot; unchanged objects are hard-linked from the
previous snapshot instead of downloaded again. Nothing half-copied is ever under a <fingerprint>/ name.
The newest KEEP_SNAPSHOTS snapshots of a model are kept (a reload that fails keeps the old one serving).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading

from inferd.worker.wire.errors import ErrorCode, InferdError

from .credentials import CloudCredentials
from .location import CloudLocation
from .providers import open_store
from .store import ObjectInfo, Store

log = logging.getLogger("inferd.cloud")

KEEP_SNAPSHOTS = 3
MANIFEST = "manifest.json"


def _unavailable(message: str) -> InferdError:
    """A failed copy fails the load as any failed load does (400 / INVALID_ARGUMENT from the load API, as
    Triton); the model's index row turns UNAVAILABLE with this message as the reason."""
    return InferdError(ErrorCode.INVALID_ARG, message)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    code = getattr(exc, "error_code", None)  # Azure's service error code, e.g. AuthorizationFailure
    code = getattr(code, "value", code)
    name = "%s (%s)" % (type(exc).__name__, code) if isinstance(code, str) and code else type(exc).__name__
    return "%s: %s" % (name, text[0] if text else "")


def model_fingerprint(objects: list[ObjectInfo], prefix: str) -> str:
    h = hashlib.sha1()
    for obj in sorted(objects, key=lambda o: o.key):
        h.update(f"{obj.key[len(prefix):]}\0{obj.size}\0{obj.etag}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:24]


def _safe_relpath(rel: str) -> str | None:
    """`rel` as a path inside the model directory, or None for a key that would leave it."""
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") or "\0" in p or "\\" in p for p in parts):
        return None
    return os.path.join(*parts)


class CloudRepository:
    def __init__(self, loc: CloudLocation, creds: CloudCredentials, cache_dir: str, timeout_s: float) -> None:
        self.loc = loc
        self.url = loc.url
        self.creds = creds
        self.timeout_s = timeout_s
        self.root = os.path.join(cache_dir, hashlib.sha1(loc.url.encode()).hexdigest()[:16])
        self._store: Store | None = None
        self._lock = threading.Lock()
        self.closing = threading.Event()  # set at shutdown: a copy under way stops at its next object
        self.names: dict[str, str] = {}  # model name -> fingerprint, from the last full listing

    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                try:
                    self._store = open_store(self.loc, self.creds, self.timeout_s)
                except Exception as exc:
                    raise _unavailable(f"failed to open model repository '{self.url}': {_describe(exc)}") from exc
            return self._store

    def _list(self, prefix: str) -> list[ObjectInfo]:
        try:
            return list(self.store().list(prefix))
        except InferdError:
            raise
        except Exception as exc:
            raise _unavailable(f"failed to read model repository '{self.url}': {_describe(exc)}") from exc

    def refresh(self) -> dict[str, str]:
        """List the whole repository: {model name: fingerprint}, remembered in `names`."""
        by_model: dict[str, list[ObjectInfo]] = {}
        for obj in self._list(self.loc.prefix):
            name, sep, _ = obj.key[len(self.loc.prefix):].partition("/")
            if sep and name:  # objects directly under the repository are not models
                by_model.setdefault(name, []).append(obj)
        prefix = self.loc.prefix
        self.names = {name: model_fingerprint(objs, f"{prefix}{name}/") for name, objs in by_model.items()}
        return dict(self.names)

    def model_objects(self, name: str) -> list[ObjectInfo]:
        """The objects of one model (fresh listing); [] when the repository has no such model."""
        objects = self._list(f"{self.loc.prefix}{name}/")
        names = dict(self.names)  # replaced, never changed in place: the event loop reads it unlocked
        if objects:
            names[name] = model_fingerprint(objects, f"{self.loc.prefix}{name}/")
        else:
            names.pop(name, None)
        self.names = names
        return objects

    def materialize(self, name: str, objects: list[ObjectInfo]) -> str:
        """The local repository root holding a complete copy of model `name` (downloaded when needed)."""
        prefix = f"{self.loc.prefix}{name}/"
        fp = model_fingerprint(objects, prefix)
        base = os.path.join(self.root, name)
        snap = os.path.join(base, fp)
        if os.path.isfile(os.path.join(snap, MANIFEST)):
            with contextlib.suppress(OSError):
                os.utime(os.path.join(snap, MANIFEST))  # in use again: newest for _prune
            return snap
        os.makedirs(base, exist_ok=True)
        previous = self._previous_files(base)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=base)
        try:
            model_dir = os.path.join(tmp, name)
            os.makedirs(model_dir)
            fetched = linked = 0
            for obj in objects:
                if self.closing.is_set():
                    raise _unavailable(f"copying model '{name}' from '{self.url}' stopped: the server is shutting down")
                rel = _safe_relpath(obj.key[len(prefix):])
                if rel is None:
                    continue  # the model directory itself ("name/") or a key that would escape it
                dest = os.path.join(model_dir, rel)
                if obj.key.endswith("/"):  # a "directory" marker object
                    os.makedirs(dest, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                if self._link_previous(previous, rel, obj, dest):
                    linked += 1
                else:
                    self._download(name, obj, dest)
                    fetched += 1
            manifest = [{"path": rel, "size": o.size, "etag": o.etag}
                        for o in objects if (rel := _safe_relpath(o.key[len(prefix):])) and not o.key.endswith("/")]
            with open(os.path.join(tmp, MANIFEST), "w") as f:
                json.dump({"url": self.url, "model": name, "objects": manifest}, f)
            try:
                os.rename(tmp, snap)  # atomic: the snapshot appears complete or not at all
            except OSError:
                if not os.path.isfile(os.path.join(snap, MANIFEST)):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another loader made the same snapshot first
            log.info("copied model '%s' from %s: %d object(s) downloaded, %d unchanged", name, self.url,
                     fetched, linked)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(base, keep=snap)
        return snap

    def _download(self, name: str, obj: ObjectInfo, dest: str) -> None:
        try:
            self.store().download(obj.key, dest)
        except InferdError:
            raise
        except Exception as exc:
            raise _unavailable(f"failed to download '{obj.key}' of model '{name}' from '{self.url}': "
                               f"{_describe(exc)}") from exc
        size = os.path.getsize(dest)
        if size != obj.size:
            raise _unavailable(f"failed to download '{obj.key}' of model '{name}' from '{self.url}': "
                               f"{size} bytes received, the object has {obj.size}")

    @staticmethod
    def _previous_files(base: str) -> dict[tuple[str, int, str], str]:
        """(path, size, etag) -> a file of an existing snapshot of this model."""
        out: dict[tuple[str, int, str], str] = {}
        with contextlib.suppress(OSError):
            for entry in os.listdir(base):
                try:
                    with open(os.path.join(base, entry, MANIFEST)) as f:
                        doc = json.load(f)
                    for o in doc["objects"]:
                        out[(o["path"], int(o["size"]), o["etag"])] = os.path.join(base, entry, doc["model"],
                                                                                   o["path"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return out

    @staticmethod
    def _link_previous(previous: dict[tuple[str, int, str], str], rel: str, obj: ObjectInfo, dest: str) -> bool:
        src = previous.get((rel, obj.size, obj.etag))
        if not obj.etag or src is None:
            return False
        try:
            if os.path.getsize(src) != obj.size:
                return False
            os.link(src, dest)
            return True
        except OSError:
            return False

    @staticmethod
    def _prune(base: str, keep: str) -> None:
        """Drop all but the newest KEEP_SNAPSHOTS snapshots, and copies left by dead processes."""
        snaps = []
        for entry in os.listdir(base):
            path = os.path.join(base, entry)
            if entry.startswith(".tmp-"):
                pid = entry.split("-")[1]
                if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                    shutil.rmtree(path, ignore_errors=True)
                continue
            with contextlib.suppress(OSError):
                snaps.append((os.stat(os.path.join(path, MANIFEST)).st_mtime, path))
        snaps.sort(reverse=True)
        for _, path in snaps[KEEP_SNAPSHOTS:]:
            if path != keep:
                shutil.rmtree(path, ignore_errors=True)
