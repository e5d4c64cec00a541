"""What a scheduler needs from an instance and what it hands back: kept tiny so that the default
scheduler, the dynamic batcher and the sequence batcher share one shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from inferd.worker.wire.errors import InferdError

from ..core.types import InferRequest, InferResponse


@dataclass
class BatchResult:
    responses: list[InferResponse | InferdError]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    extra: dict = field(default_factory=dict)


class Executor(Protocol):
    """One model instance as the scheduler sees it."""

    name: str

    @property
    def ready(self) -> bool: ...

    async def run_batch(self, requests: list[InferRequest]) -> BatchResult: ...
