"""A request's model resolved once (core/resolution.py): a handle answers as resolving its name again would,
across an unload, a reload and a readiness change, over the real registry (core/models.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from inferd.supervisor.core.models import READY, UNAVAILABLE, ModelManager, ModelVersion
from inferd.supervisor.core.resolution import Resolution
from inferd.worker.wire.errors import ErrorCode, InferdError


def _version(number: int, decoupled: bool = False) -> ModelVersion:
    instance = SimpleNamespace(ready=True)  # what ModelVersion.ready reads of an instance
    return ModelVersion("m", number, {"name": "m"}, "", None, [instance], None, None,  # type: ignore[arg-type]
                        decoupled=decoupled, metadata_base={"name": "m", "platform": "python"}, state=READY)


def _registry() -> tuple[ModelManager, Resolution]:
    manager = ModelManager(SimpleNamespace(load_threads=1, repos=None), None)  # type: ignore[arg-type]
    return manager, Resolution(manager)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except InferdError as exc:
        return (exc.code, exc.message)


def test_a_handle_is_made_once_per_change() -> None:
    manager, r = _registry()
    manager.entry("m").versions[1] = _version(1, decoupled=True)
    handle = r.model("m")
    assert handle.decoupled and handle.mv.version == 1 and r.model("m") is handle
    assert handle.metadata() == {"name": "m", "versions": ["1"], "platform": "python"}
    assert handle.config() == {"name": "m"}
    manager.changed()
    assert r.model("m") is not handle
    with pytest.raises(InferdError) as unknown:
        r.model("other")
    assert unknown.value.code == ErrorCode.NOT_FOUND


def test_a_handle_made_before_an_unload_answers_as_the_name_does() -> None:
    manager, r = _registry()
    entry = manager.entry("m")
    entry.versions[1] = _version(1)
    handle, pinned = r.model("m"), r.model("m", "1")
    assert r.ready_version(handle) is entry.versions[1]
    del entry.versions[1]  # unloaded (as ModelManager.unload leaves it)
    entry.records[1] = (UNAVAILABLE, "unloaded")
    manager.changed()
    for h in (handle, pinned):
        assert _outcome(r.ready_version, h) == _outcome(r.resolve_ready, "m", h.version)
        assert _outcome(h.metadata) == _outcome(r.resolve_ready, "m", h.version)
        assert _outcome(h.config) == _outcome(r.resolve, "m", h.version)
    assert _outcome(r.ready_version, handle)[0] == ErrorCode.NOT_FOUND


def test_a_handle_made_before_a_reload_reaches_the_new_version() -> None:
    manager, r = _registry()
    entry = manager.entry("m")
    entry.versions[1] = _version(1)
    handle = r.model("m")
    entry.versions[2] = _version(2)
    manager.changed()
    assert r.ready_version(handle) is entry.versions[2] is r.resolve_ready("m")


def test_readiness_is_checked_as_resolving_checks_it() -> None:
    manager, r = _registry()
    entry = manager.entry("m")
    entry.versions[1] = mv = _version(1)
    pinned = r.model("m", "1")
    mv.state = "LOADING"  # (no change reported: an explicit version's readiness is read when it is used)
    assert _outcome(r.ready_version, pinned) == _outcome(r.resolve_ready, "m", "1")
    assert _outcome(r.ready_version, pinned)[0] == ErrorCode.UNAVAILABLE
    manager.changed()
    unready = r.model("m")  # no ready version: the highest one, which is refused when used
    assert unready.mv is mv and not unready.checked
    assert _outcome(r.ready_version, unready) == _outcome(r.resolve_ready, "m")
