"""A parsed inference request as plain values, for comparing what two parsers made of one body."""

from __future__ import annotations

from typing import Any

from inferd.supervisor.http_api.codec import ParsedInfer


def parsed_fields(p: ParsedInfer) -> tuple[Any, ...]:
    r = p.request
    return (r.model_name, r.model_version, r.id,
            [(t.name, t.datatype, list(t.shape), bytes(t.data), t.parameters, t.shm_ref) for t in r.inputs],
            [(o.name, o.parameters) for o in r.outputs], r.parameters, r.correlation_id, r.flags, r.priority,
            r.timeout_us, r.device_outputs, p.binary_default,
            {k: (v.binary, v.shm) for k, v in p.plans.items()})
