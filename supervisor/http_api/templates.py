"""Parsed binary-request headers remembered by their bytes.

Clients of the binary tensor extension (tritonclient among them) send the same JSON header again and
again: same tensor names, shapes, sizes and options, new tensor bytes after it. Everything the codec
derives from such a header depends only on its bytes and the body size, so a header seen before is
not parsed and checked again: its template is filled in with views of the new body (about a quarter
of the supervisor's Python work for a small binary request).

A template is kept only when nothing it holds depends on more than the header: no shared-memory input
(its bytes live in a region that can change) and no BYTES input sent as binary data (its framing is
checked against the bytes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor

if TYPE_CHECKING:
    from .parsed import OutputPlan, ParsedInfer

MAX_HEADER = 4096  # longer headers are parsed every time
MAX_TEMPLATES = 128  # per codec; the table is cleared when full


class HeaderTemplate:
    __slots__ = ("id", "parameters", "correlation_id", "flags", "priority", "timeout_us", "inputs", "outputs",
                 "binary_default", "plans", "shm_outputs")

    def __init__(self, req: InferRequest, inputs: list[tuple[str, str, list[int], Any, int, dict[str, Any]]],
                 binary_default: bool, plans: dict[str, OutputPlan]) -> None:
        # copies throughout: the request handed on may be changed downstream, the template must not
        self.id = req.id
        self.parameters = dict(req.parameters)
        self.correlation_id = req.correlation_id
        self.flags = req.flags
        self.priority = req.priority
        self.timeout_us = req.timeout_us
        self.inputs = inputs  # (name, datatype, shape, inline bytes or None, size, parameters)
        self.outputs = [(o.name, dict(o.parameters)) for o in req.outputs]
        self.binary_default = binary_default
        self.plans = dict(plans)  # the OutputPlan objects are only read after parsing
        self.shm_outputs = any(p.shm is not None for p in plans.values())  # outputs that may go to a CUDA region

    @classmethod
    def of(cls, parsed: ParsedInfer, body: Any, hlen: int) -> HeaderTemplate | None:
        """The template of a request just parsed from `body`, or None when it cannot have one."""
        inputs: list[tuple[str, str, list[int], Any, int, dict[str, Any]]] = []
        for t in parsed.request.inputs:
            data = t.data
            if type(data) is bytes:  # inline JSON data: part of the header
                inputs.append((t.name, t.datatype, list(t.shape), data, len(data), dict(t.parameters)))
            elif isinstance(data, memoryview) and data.obj is body and t.datatype != "BYTES":
                inputs.append((t.name, t.datatype, list(t.shape), None, data.nbytes, dict(t.parameters)))
            else:  # shared memory, or BYTES framing to check
                return None
        return cls(parsed.request, inputs, parsed.binary_default, parsed.plans)

    def instantiate(self, model: str, version: str, body: Any,
                    hlen: int) -> tuple[InferRequest, bool, dict[str, OutputPlan]]:
        """A fresh request (and ParsedInfer's other fields) as parsing the same header over `body` gives."""
        view = memoryview(body)
        if type(body) is not bytes:
            view = view.cast("B")
        pos = hlen
        tensors = []
        for name, datatype, shape, inline, size, params in self.inputs:
            if inline is None:
                data: Any = view[pos:pos + size]
                pos += size
            else:
                data = inline
            tensors.append(Tensor(name, datatype, list(shape), data, dict(params) if params else {}))
        req = InferRequest(model, version, self.id, tensors,
                           [RequestedOutput(n, dict(p) if p else {}) for n, p in self.outputs],
                           dict(self.parameters) if self.parameters else {}, self.correlation_id, self.flags,
                           self.priority, self.timeout_us)
        return req, self.binary_default, dict(self.plans)
