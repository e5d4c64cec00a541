"""inferd's own status view (GET /v2/inferd/status), read from the model manager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def status_json(manager: Any, name: str = "",
                direct_inflight: Callable[[int, str], int] | None = None) -> dict[str, Any]:
    """inferd's own status view (GET /v2/inferd/status): models, versions, instances, worker pids (the
    data plane has checked that `name`, if given, is known). `direct_inflight(serial, instance)`: requests
    the frontend processes have in flight on an instance over their own connections."""
    models: list[dict[str, Any]] = []
    for row in manager.index():
        if name and row["name"] != name:
            continue
        entry = manager.entries.get(row["name"])
        mv = entry.versions.get(int(row["version"])) if entry and row.get("version") else None
        instances = []
        if mv is not None:
            for inst in mv.instances:
                err = inst.last_error
                inflight = inst.inflight + (direct_inflight(mv.serial, inst.name) if direct_inflight else 0)
                instances.append({"name": inst.name, "pid": inst.pid, "state": inst.state.value,
                                  "restarts": inst.restarts, "restart_reasons": dict(inst.restart_reasons),
                                  "memory_limit": inst.memory_limit, "inflight": inflight,
                                  "last_error": err.message if err is not None else ""})
        models.append({"name": row["name"], "version": row.get("version", ""),
                       "state": row.get("state", ""), "reason": row.get("reason", ""),
                       "instances": instances})
    return {"models": models}
