"""The state a frontend process answers synchronous queries from, built by the core on every change.

`build(dataplane)` (core side) renders what the DataPlane's synchronous reads would answer now: live,
ready, server metadata, and per model and version key ("" and each loaded version) its metadata, config,
readiness and decoupled flag, each a value or the error the core would raise; plus the client system
shared-memory registrations, which every frontend opens itself (it reads and writes those regions with
its own fds), and the log settings (a POST /v2/logging applies in every process). `View` (frontend
side) answers the same questions from one such document; a version key the core does not know gets the
error the core's resolution would give, and `View.model` resolves a request's model from it into a handle
(core/model_handle.py) once per request, as the core's data plane does.
"""

from __future__ import annotations

from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..core import readiness
from ..core.dataplane_impl import ServerDataPlane
from ..core.model_handle import ModelHandle
from . import direct_core

MAX_HANDLES = 1024  # handles a View remembers (cleared when full: a client may spell one version many ways)


def _answer(fn: Any, *args: Any) -> Any:
    try:
        return {"ok": fn(*args)}
    except InferdError as exc:
        return {"err": [int(exc.code), exc.message]}


def _model(dp: ServerDataPlane, name: str, version: str) -> dict[str, Any]:
    try:
        handle = dp.model(name, version)
    except InferdError as exc:  # metadata, config and decoupled: the same refusal
        refused = {"err": [int(exc.code), exc.message]}
        doc: dict[str, Any] = {"meta": refused, "config": refused, "decoupled": refused}
    else:
        doc = {"meta": _answer(handle.metadata), "config": _answer(handle.config),
               "decoupled": {"ok": handle.decoupled}}
    doc["ready"] = dp.model_ready(name, version)
    serial = direct_core.serial_of(dp, name, version)
    if serial is not None:
        doc["direct"] = serial  # served straight to its workers (the doc's "direct" section)
    if _asks(dp, name, version):
        doc["asks"] = True  # its readiness comes from its is_ready(): the frontend asks the core
    return doc


def _asks(dp: ServerDataPlane, name: str, version: str) -> bool:
    try:
        return readiness.asks_model(dp.resolve(name, version))
    except InferdError:
        return False


def build(dp: ServerDataPlane, version: int, trace_armed: bool) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for name, entry in list(dp.manager.entries.items()):
        if not entry.versions and not entry.records:
            continue
        keys = [""] + [str(v) for v in entry.versions]
        models[name] = {key: _model(dp, name, key) for key in keys}
    shm = dp.shm
    regions = [[r.name, r.key, r.offset, r.byte_size] for r in shm.system.values()] if shm is not None else []
    ready_asks = dp.strict_readiness and any(readiness.asks_model(mv) for mv in dp.manager.loaded_versions())
    return {"version": version, "live": dp.live(), "ready": dp.ready(), "ready_asks": ready_asks,
            "server": dp.server_metadata(), "models": models, "shm_allowed": shm is not None, "shm": regions,
            "trace_armed": trace_armed, "log": dp.log_settings(), "direct": direct_core.section(dp)}


def _raise(err: list[Any]) -> Any:
    raise InferdError(ErrorCode(int(err[0])), str(err[1]))


class View:
    """Answers from one snapshot document (replaced whole on every update)."""

    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        self.doc: dict[str, Any] = doc or {"version": 0, "live": True, "ready": False, "models": {},
                                           "server": {"name": "triton", "version": "", "extensions": []},
                                           "shm_allowed": False, "shm": [], "trace_armed": False}
        self._handles: dict[Any, SnapshotModel] = {}  # name, or (name, version) -> its handle

    @property
    def version(self) -> int:
        return int(self.doc["version"])

    def _entry(self, name: str, version: str) -> dict[str, Any]:
        versions = self.doc["models"].get(name)
        if versions is None:
            raise InferdError(ErrorCode.NOT_FOUND, "Request for unknown model: '%s' is not found" % name)
        entry = versions.get(version)
        if entry is not None:
            return entry  # type: ignore[no-any-return]
        try:
            int(version)
        except ValueError:
            raise InferdError(ErrorCode.NOT_FOUND,
                              "invalid model version '%s' for model '%s'" % (version, name)) from None
        raise InferdError(ErrorCode.NOT_FOUND, "Request for unknown model: '%s' version %s is not found"
                          % (name, version))

    def value(self, what: str, name: str, version: str) -> Any:
        answer = self._entry(name, version)[what]
        if "err" in answer:
            _raise(answer["err"])
        return answer["ok"]

    def model(self, name: str, version: str) -> SnapshotModel:
        """The handle of a request's model, as the core's data plane would resolve it (DataPlane.model)."""
        key: Any = (name, version) if version else name
        handle = self._handles.get(key)
        if handle is None:
            entry = self._entry(name, version)
            decoupled = entry["decoupled"]
            if "err" in decoupled:
                _raise(decoupled["err"])
            handle = SnapshotModel(name, version, bool(decoupled["ok"]), entry)
            if len(self._handles) >= MAX_HANDLES:
                self._handles.clear()
            self._handles[key] = handle
        return handle

    def model_ready(self, name: str, version: str) -> bool:
        try:
            return bool(self._entry(name, version)["ready"])
        except InferdError:
            return False

    def model_asks(self, name: str, version: str) -> bool:
        """Whether the model's readiness comes from its is_ready() (asked in the core)."""
        try:
            return bool(self._entry(name, version).get("asks"))
        except InferdError:
            return False


class SnapshotModel(ModelHandle):
    """A frontend process's handle: its model's answers in the snapshot it was resolved from. Inference goes
    to the core by name (which resolves it there, as the snapshot showed it or as it has changed since)."""

    __slots__ = ("_entry", "direct")

    def __init__(self, name: str, version: str, decoupled: bool, entry: dict[str, Any]) -> None:
        super().__init__(name, version, decoupled)
        self._entry = entry
        self.direct: int | None = entry.get("direct")  # the serial of its direct version (direct_core.py)

    def metadata(self) -> dict[str, Any]:
        return _ok(self._entry["meta"])  # type: ignore[no-any-return]

    def config(self) -> dict[str, Any]:
        return _ok(self._entry["config"])  # type: ignore[no-any-return]


def _ok(answer: dict[str, Any]) -> Any:
    if "err" in answer:
        _raise(answer["err"])
    return answer["ok"]
