"""The common JSON inference request, parsed in one pass.

Most JSON clients send the same simple form: an optional string id, inputs that each give exactly a
name, a numeric datatype, a shape and a flat `data` array, and outputs named with at most a
`binary_data` flag. `parse_plain` turns such a document into what codec.InferCodec's general parser
gives, without its per-field layers; for anything else (parameters, nesting, BYTES, a value out of the
simple case, any error) it returns None and the general parser runs from the start, so errors and
their messages come from one place.
"""

from __future__ import annotations

from typing import Any, Protocol

from inferd.supervisor.inference.tensors import ARRAY_CODES, INT64_MAX, MAX_DIMS, pack_plain
from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor
from inferd.worker.wire.dtypes import BY_NAME

from .parsed import OutputPlan, ParsedInfer


class Limits(Protocol):
    """The caps parse_plain applies (codec.Limits has them)."""

    @property
    def max_tensors(self) -> int: ...
    @property
    def max_name_len(self) -> int: ...

_DOC_KEYS = frozenset(("id", "inputs", "outputs"))
# datatype -> (array typecode, item size, whether a float type) for the numeric types the array module packs
PLAIN = {name: (code, BY_NAME[name].itemsize, code in "fd") for name, code in ARRAY_CODES.items()}


def parse_plain(model: str, version: str, doc: dict[str, Any], lim: Limits) -> ParsedInfer | None:
    """`doc` (a JSON object) as the general parser reads it, or None when it is not the simple form."""
    if len(doc) > 1 and not doc.keys() <= _DOC_KEYS:
        return None
    inputs = doc.get("inputs")
    if type(inputs) is not list or len(inputs) > lim.max_tensors:
        return None
    rid = doc.get("id", "")
    if type(rid) is not str:
        return None
    max_name = lim.max_name_len
    tensors = []
    for item in inputs:
        # exactly four keys, each one of the four (a missing one reads None, which no check below passes)
        if type(item) is not dict or len(item) != 4:
            return None
        name = item.get("name")
        datatype = item.get("datatype")
        shape = item.get("shape")
        data = item.get("data")
        if type(name) is not str or not name or len(name) > max_name:
            return None
        plain = PLAIN.get(datatype) if type(datatype) is str else None
        if plain is None or type(shape) is not list or len(shape) > MAX_DIMS or type(data) is not list or not data:
            return None
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return None
            count *= d
        code, itemsize, _ = plain
        if count != len(data) or count * itemsize > INT64_MAX:
            return None
        packed = pack_plain(code, data)
        if packed is None:
            return None
        tensors.append(Tensor(name, datatype, shape, packed, {}))
    if len(tensors) > 1 and len({t.name for t in tensors}) != len(tensors):
        return None  # an input given twice
    request = InferRequest(model, version, rid, tensors)
    parsed = ParsedInfer(request)
    outputs = doc.get("outputs")
    if outputs is not None:
        if type(outputs) is not list or len(outputs) > lim.max_tensors:
            return None
        plans = parsed.plans
        requested = request.outputs
        for item in outputs:
            if type(item) is not dict:
                return None
            name = item.get("name")
            if type(name) is not str or not name or len(name) > max_name or name in plans:
                return None
            n = len(item)
            if n == 1:
                plans[name] = OutputPlan()
                requested.append(RequestedOutput(name, {}))
                continue
            params = item.get("parameters")
            if n != 2 or type(params) is not dict or len(params) != 1:
                return None
            binary = params.get("binary_data")
            if type(binary) is not bool:
                return None
            plans[name] = OutputPlan(binary)
            requested.append(RequestedOutput(name, {"binary_data": binary}))
    return parsed
