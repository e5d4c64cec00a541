"""Hot-path framing of Execute / ExecuteResult, byte-compatible with `wire.messages`.

`wire.messages.encode` goes through `dataclasses.asdict` (tens of µs per batch); here the Execute
header is built as plain dicts in the dataclasses' field order and serialized with orjson, and an
ExecuteResult header is read as plain dicts, checked as it is used. Every other message goes through
`wire.messages`. tests/unit/instances/test_codec.py pins the equivalence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson
from inferd.supervisor.core.types import InferRequest
from inferd.worker.wire import messages as m


def tensor_ref(name: str, datatype: str, shape: Sequence[int], loc: str, frame: int, region: str,
               offset: int, nbytes: int) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(shape), "loc": loc, "frame": frame,
            "region": region, "offset": offset, "nbytes": nbytes}


def request_item(request_id: int, req: InferRequest, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "id": req.id,
        "inputs": inputs,
        "requested_outputs": [o.name for o in req.outputs],
        "parameters": json.dumps(req.parameters) if req.parameters else "{}",
        "correlation_id": req.correlation_id,
        "flags": req.flags,
        "timeout_us": req.timeout_us,
    }


def execute_header(batch_id: int, items: list[dict[str, Any]], forget: list[str]) -> bytes:
    return orjson.dumps({"batch_id": batch_id, "requests": items, "forget_regions": forget, "t": "execute"})


def parse(frames: Sequence[Any]) -> tuple[Any, Sequence[Any]]:
    """(message, data frames). An ExecuteResult stays a dict (tag "execute_result"); others are decoded
    by wire.messages. Raises wire.messages.ProtocolError on anything malformed."""
    if not frames:
        raise m.ProtocolError("empty message")
    try:
        header = orjson.loads(frames[0].bytes)
    except orjson.JSONDecodeError as exc:
        raise m.ProtocolError(f"malformed message: {exc}") from None
    if type(header) is dict and header.get("t") == "execute_result":
        return header, frames[1:]
    return m.decode(frames)
