"""A decoded inference request and its per-output plans: what codec.py produces and templates.py caches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferd.supervisor.inference.types import InferRequest


@dataclass(slots=True)
class OutputPlan:
    binary: bool | None = None  # None: the request-level default
    shm: tuple[str, int, int] | None = None  # region, offset, byte_size


@dataclass(slots=True)
class ParsedInfer:
    request: InferRequest
    binary_default: bool = False
    plans: dict[str, OutputPlan] = field(default_factory=dict)
    hold: Any = None  # memory.client_shm.ShmHold: the shm regions it names, held until its answer is written
