"""Rolling restart of a model's instances on demand (POST /v2/inferd/models/<m>/restart, infer-ctl restart):
each instance's worker is replaced as recycling replaces it (instances/recycle.py, Instance.recycle), one
instance at a time, so that the model keeps its other instances' capacity and fails no request."""

from __future__ import annotations

from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError


async def restart_model(manager: Any, name: str) -> dict[str, Any]:
    """Replace the workers of every instance of every loaded version of `name`; returns
    {"name", "instances": [{"version", "name", "restarted", "pid_before", "pid_after", "state"}]}.
    An instance that is not ready (restarting, failed) is left to its restart policy (restarted False).
    NOT_FOUND for a model that has no loaded version; a load or unload of the model waits for it."""
    lookup = getattr(manager, "lookup", None)  # (--model-namespacing resolves names there)
    entry = lookup(name) if lookup is not None else manager.entries.get(name)
    if entry is None or not entry.versions:
        raise InferdError(ErrorCode.NOT_FOUND, f"cannot restart '{name}': no version of it is loaded")
    rows: list[dict[str, Any]] = []
    async with entry.lock:
        for version, mv in sorted(entry.versions.items()):
            for inst in mv.instances:
                before = inst.pid
                done = await inst.recycle("restart asked for")
                rows.append({"version": str(version), "name": inst.name, "restarted": done, "pid_before": before,
                             "pid_after": inst.pid, "state": inst.state.value})
    if not rows:
        raise InferdError(ErrorCode.INVALID_ARG, f"cannot restart '{name}': it has no instances of its own (an "
                                                 "ensemble: restart its steps' models)")
    return {"name": name, "instances": rows}
