"""The state a frontend process answers synchronous queries from, built by the core on every change.

`build(dataplane)` (core side) renders what the DataPlane's synchronous reads would answer now: live,
ready, server metadata, and per model and version key ("" and each loaded version) its metadata, config,
readiness and decoupled flag, each a value or the error the core would raise; plus the client system
shared-memory registrations, which every frontend opens itself (it reads and writes those regions with
its own fds), and the log settings (a POST /v2/logging applies in every process). `View` (frontend
side) answers the same questions from one such document; a version key the core does not know gets the
error the core's resolution would give.
"""

from __future__ import annotations

from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..core import readiness
from ..core.dataplane_impl import ServerDataPlane


def _answer(fn: Any, *args: Any) -> Any:
    try:
        return {"ok": fn(*args)}
    except InferdError as exc:
        return {"err": [int(exc.code), exc.message]}


def _model(dp: ServerDataPlane, name: str, version: str) -> dict[str, Any]:
    doc = {"meta": _answer(dp.model_metadata, name, version), "config": _answer(dp.model_config, name, version),
           "decoupled": _answer(dp.model_is_decoupled, name, version), "ready": dp.model_ready(name, version)}
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
            "trace_armed": trace_armed, "log": dp.log_settings()}


def _raise(err: list[Any]) -> Any:
    raise InferdError(ErrorCode(int(err[0])), str(err[1]))


class View:
    """Answers from one snapshot document (replaced whole on every update)."""

    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        self.doc: dict[str, Any] = doc or {"version": 0, "live": True, "ready": False, "models": {},
                                           "server": {"name": "triton", "version": "", "extensions": []},
                                           "shm_allowed": False, "shm": [], "trace_armed": False}

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
