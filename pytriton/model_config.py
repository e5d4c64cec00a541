"""Model configuration objects of the PyTriton API (`ModelConfig`, `Tensor`, `DynamicBatcher`...)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional

import numpy as np


class DeviceKind(enum.Enum):
    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: Optional[list] = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: Optional[QueuePolicy] = None
    priority_queue_policy: Optional[dict[int, QueuePolicy]] = None


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An input or output of a bound model: `shape` without the batch axis (-1: any size)."""

    shape: tuple
    dtype: Any
    name: Optional[str] = None
    optional: Optional[bool] = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)


@dataclasses.dataclass
class ModelConfig:
    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: Optional[list] = None


__all__ = ["DeviceKind", "DynamicBatcher", "ModelConfig", "QueuePolicy", "Tensor", "TimeoutAction"]
