"""Resolving a request's model name and version to a loaded ModelVersion, in the server's process.

`Resolution` (a part of ServerDataPlane) holds the registry's answers a request needs: `resolve` and
`resolve_ready` by name, and `model(name, version)`, the handle (core/model_handle.py) a frontend resolves
once per request. Handles and the ready version of each name are remembered until the registry reports a
change (an instance's state, a load, an unload: ModelManager.watch); each change starts a new generation.
A handle of an older generation is resolved again by its name when it is used, so a request that resolved
its model before an unload or reload gets what it got before handles existed: the error of the unloaded
model, or the reloaded version.
"""

from __future__ import annotations

from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from .model_handle import ModelHandle
from .models import ModelManager, ModelVersion

MAX_HANDLES = 1024  # remembered handles (cleared when full: a client may spell one version many ways)


class LocalModel(ModelHandle):
    """A handle of the in-process data plane: the ModelVersion `name`/`version` resolved to in `generation`.
    `checked`: that version was the name's ready version then (nothing to check again in that generation)."""

    __slots__ = ("mv", "generation", "checked", "_resolution")

    def __init__(self, resolution: Resolution, name: str, version: str, mv: ModelVersion, generation: int,
                 checked: bool) -> None:
        super().__init__(name, version, mv.decoupled)
        self.mv = mv
        self.generation = generation
        self.checked = checked
        self._resolution = resolution

    def metadata(self) -> dict[str, Any]:
        mv = self._resolution.ready_version(self)
        versions = [str(mv.version)] if self.version else sorted(
            (str(v) for v, m in self._resolution.manager.lookup(self.name).versions.items() if m.ready),  # type: ignore[union-attr]
            key=int)
        base = mv.metadata_base
        meta = {"name": base["name"], "versions": versions}
        meta.update((k, v) for k, v in base.items() if k != "name")
        return meta

    def config(self) -> dict[str, Any]:
        r = self._resolution
        return (self.mv if self.generation == r.generation else r.resolve(self.name, self.version)).config


class Resolution:
    manager: ModelManager

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.generation = 0  # one more on every change the registry reports
        # name -> the version a request without a version resolves to, only while it is ready
        self._ready: dict[str, ModelVersion] = {}
        self._handles: dict[Any, LocalModel] = {}  # name, or (name, version) -> its handle
        manager.watch(self._forget)

    def _forget(self) -> None:
        self._ready.clear()
        self._handles.clear()
        self.generation += 1

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The version a request targets: "" = highest ready version (policy already applied at load)."""
        if not version:
            cached = self._ready.get(name)
            if cached is not None:
                return cached
        e = self.manager.lookup(name)  # (--model-namespacing: a name of several models is refused)
        if e is None or (not e.versions and not e.records):
            raise InferdError(ErrorCode.NOT_FOUND, "Request for unknown model: '%s' is not found" % name)
        if version:
            try:
                v = int(version)
            except ValueError:
                raise InferdError(ErrorCode.NOT_FOUND,
                                  "invalid model version '%s' for model '%s'" % (version, name)) from None
            mv = e.versions.get(v)
            if mv is None:
                raise InferdError(ErrorCode.NOT_FOUND,
                                  "Request for unknown model: '%s' version %s is not found" % (name, version))
            return mv
        ready = [v for v, mv in e.versions.items() if mv.ready]
        if ready:
            mv = e.versions[max(ready)]
            self._ready[name] = mv
            return mv
        if e.versions:
            return e.versions[max(e.versions)]
        raise InferdError(ErrorCode.NOT_FOUND, "Request for unknown model: '%s' has no available versions" % name)

    def resolve_ready(self, name: str, version: str = "") -> ModelVersion:
        """As `resolve`, refusing a version that is not ready (UNAVAILABLE)."""
        if not version:
            cached = self._ready.get(name)
            if cached is not None:
                return cached
        mv = self.resolve(name, version)
        if not mv.ready:
            raise _not_ready(name, mv)
        return mv

    def model(self, name: str, version: str = "") -> LocalModel:
        """The handle of `name` at `version` (DataPlane.model): remembered for the generation."""
        key: Any = (name, version) if version else name
        handle = self._handles.get(key)
        if handle is not None:
            return handle
        mv = self.resolve(name, version)
        handle = LocalModel(self, name, version, mv, self.generation, not version and self._ready.get(name) is mv)
        if len(self._handles) >= MAX_HANDLES:
            self._handles.clear()
        self._handles[key] = handle
        return handle

    def ready_version(self, handle: LocalModel) -> ModelVersion:
        """What `resolve_ready(handle.name, handle.version)` answers now, without looking the name up
        again while the registry has not changed since the handle was made."""
        if handle.generation != self.generation:
            return self.resolve_ready(handle.name, handle.version)
        mv = handle.mv
        if not handle.checked and not mv.ready:
            raise _not_ready(handle.name, mv)
        return mv


def _not_ready(name: str, mv: ModelVersion) -> InferdError:
    return InferdError(ErrorCode.UNAVAILABLE, "Request for unavailable model: '%s' version %d is not ready (%s)"
                       % (name, mv.version, mv.reason or "no ready instance"))
