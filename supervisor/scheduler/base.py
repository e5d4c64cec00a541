"""What a scheduler needs from an instance: kept tiny so that the default scheduler, the dynamic
batcher and the sequence batcher share one shape (instances.instance.Instance fits it)."""

from __future__ import annotations

from typing import Any, Protocol

from ..core.types import InferRequest


class Executor(Protocol):
    """One model instance as the scheduler sees it."""

    name: str

    @property
    def ready(self) -> bool: ...

    async def execute(self, requests: list[InferRequest]) -> Any:
        """A BatchResult: .responses (InferResponse | InferdError per request) and compute_*_ns."""
