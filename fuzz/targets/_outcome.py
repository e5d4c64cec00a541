"""What a codec made of a request body, as plain values two readings can be compared by."""

from __future__ import annotations

from typing import Any

from inferd.supervisor.http_api.parsed import ParsedInfer
from inferd.worker.wire.errors import InferdError


def fields(p: ParsedInfer) -> tuple[Any, ...]:
    r = p.request
    return (r.model_name, r.model_version, r.id,
            [(t.name, t.datatype, list(t.shape), bytes(t.data), t.parameters, t.shm_ref) for t in r.inputs],
            [(o.name, o.parameters) for o in r.outputs], r.parameters, r.correlation_id, r.flags, r.priority,
            r.timeout_us, r.device_outputs, p.binary_default, {k: (v.binary, v.shm) for k, v in p.plans.items()})


def outcome(parse: Any, *args: Any) -> tuple[Any, ...]:
    """("ok", fields) or ("error", code, message) of `parse(*args)`; any other exception propagates (a finding)."""
    try:
        return "ok", fields(parse(*args))
    except InferdError as exc:
        return "error", exc.code, exc.message
