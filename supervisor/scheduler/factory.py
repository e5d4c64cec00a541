"""Picks a model's scheduler from its normalised config (Triton JSON rendering).

`scheduling_choice` in model_config: none -> default scheduler (one request per execution),
`dynamic_batching` -> dynamic batcher, `sequence_batching` -> sequence batcher. Every scheduler has
the shape of scheduler.base.Scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Executor, Scheduler
from .batching import BatchRules
from .default import DefaultScheduler, StatsSink
from .dynamic import DynamicBatcher
from .policy import PriorityPolicy
from .rate_gate import RateGate
from .sequence.scheduler import SequenceScheduler


@dataclass(frozen=True)
class SchedulerSettings:
    max_queue_size: int = 0  # server-wide bound for a model without its own queue policy (0 = none)
    pipeline_depth: int = 1  # batches sent ahead to one worker


def make_scheduler(model_name: str, config: dict[str, Any], executors: Sequence[Executor], stats: StatsSink,
                   settings: SchedulerSettings, gate: RateGate | None = None) -> Scheduler:
    """`gate`: the rate limiter's view of the instances it limits (--rate-limit=execution_count)."""
    max_batch_size = int(config.get("max_batch_size") or 0)
    if "dynamic_batching" in config:
        db = config["dynamic_batching"] or {}
        policy = PriorityPolicy.from_dynamic_batching(db, settings.max_queue_size)
        # full batches may wait ahead in a worker's pipeline, unless queue policies must see them
        depth = 1 if policy.holds_requests else settings.pipeline_depth
        return DynamicBatcher(model_name, executors, stats, BatchRules.from_config(config), policy,
                              preserve_ordering=bool(db.get("preserve_ordering")), depth=depth, gate=gate)
    if "sequence_batching" in config:
        return SequenceScheduler(model_name, config, executors, stats, max_queue_size=settings.max_queue_size,
                                 gate=gate)
    return DefaultScheduler(model_name, executors, stats, max_queue_size=settings.max_queue_size,
                            batched=max_batch_size > 0, runners_per_instance=settings.pipeline_depth, gate=gate)
