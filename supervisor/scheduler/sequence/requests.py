"""What the worker gets for a sequence batcher's requests.

Per request the scheduler injects the configured control inputs (controls.py) and the
implicit state (state.py); the worker gets a copy of the client's request with them, so the
frontends keep answering the request the client sent.

Null requests (direct strategy, batching model): as in Triton, a batch is indexed by slot, and an
empty slot below the highest busy slot is filled with a null request: correlation id 0, no flags,
START/END/READY false, CORRID 0, data inputs of the same shapes as a real request of the batch but
zero-filled (Triton leaves them uninitialised), the initial implicit state. Python models see them in
`requests` (Triton's Python backend does too) and must answer them; their answers are dropped, and
they count in no statistic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...inference.types import SEQUENCE_END, SEQUENCE_START, InferRequest, RequestedOutput, Tensor
from . import controls, state
from .lanes import Sequence


class WorkerRequests:
    """The controls and states one model's config declares, and the requests built with them."""

    def __init__(self, model_name: str, config: dict[str, Any], model_dir: str | None) -> None:
        sb = config.get("sequence_batching") or {}
        self.batched = int(config.get("max_batch_size") or 0) > 0
        self.controls = controls.parse_controls(model_name, sb)
        self.states = state.parse_states(model_name, sb, model_dir)
        self.state_outputs = {s.output_name for s in self.states}
        self.output_names = [o["name"] for o in config.get("output") or []]

    def of(self, request: InferRequest, sequence: Sequence) -> InferRequest:
        """The copy of `request` (of `sequence`, whose state it takes) that its worker gets."""
        start = bool(request.flags & SEQUENCE_START)
        if start or not sequence.state:
            sequence.state = state.initial_tensors(self.states, self.batched)
        inputs = controls.control_tensors(
            self.controls, start=start, end=bool(request.flags & SEQUENCE_END), ready=True,
            correlation_id=request.correlation_id, batched=self.batched)
        inputs += request.inputs
        inputs += sequence.state.values()
        outputs = request.outputs
        if self.states:
            outputs = list(outputs) or [RequestedOutput(n) for n in self.output_names]
            outputs += [RequestedOutput(n) for n in self.state_outputs]
        return dataclasses.replace(request, inputs=inputs, outputs=outputs)

    def null(self, template: InferRequest) -> InferRequest:
        """A null request shaped as `template`, a real request of the same batch."""
        inputs = controls.control_tensors(self.controls, start=False, end=False, ready=False,
                                                   correlation_id=0, batched=self.batched)
        inputs += [Tensor(t.name, t.datatype, list(t.shape), _zeros_like(t)) for t in template.inputs]
        inputs += state.initial_tensors(self.states, self.batched).values()
        outputs = [RequestedOutput(n) for n in self.output_names] if self.states else []
        outputs += [RequestedOutput(n) for n in self.state_outputs]
        return InferRequest(template.model_name, template.model_version, inputs=inputs, outputs=outputs)


def _zeros_like(tensor: Tensor) -> bytes:
    if tensor.datatype != "BYTES":
        return bytes(memoryview(tensor.data).nbytes)
    count = 1
    for d in tensor.shape:
        count *= d
    return bytes(4 * count)  # empty strings
