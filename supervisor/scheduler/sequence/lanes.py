"""The sequence batcher's bookkeeping: sequences, their queued requests, and the slots of each instance
("lanes"), plus the two strategies' batch selection (pure logic, no I/O).

A sequence holds one slot of one lane from its first request until it ends (END executed, idle
release, cancellation); its requests run one at a time and in arrival order, so two requests of one
sequence never share a batch. New sequences wait in a backlog while every slot is taken.

- Direct (`DirectPolicy`): a lane has max(1, max_batch_size) slots; a batch takes the ready head of
  every slot, in slot order. Empty slots below the highest busy one are filled with null requests
  (the caller builds them), as Triton does.
- Oldest (`OldestPolicy`): a lane has max_candidate_sequences slots (default max(1, max_batch_size));
  a batch takes the oldest ready heads, up to max_batch_size, honouring preferred sizes and the
  queue delay.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

from ...inference.types import InferRequest, InferResponse, Tensor
from ..base import Executor


class SeqItem:
    """One queued or running request of a sequence."""

    __slots__ = ("request", "future", "sequence", "worker_request")

    def __init__(self, request: InferRequest, future: asyncio.Future[InferResponse], sequence: Sequence) -> None:
        self.request = request
        self.future = future
        self.sequence = sequence
        self.worker_request: InferRequest | None = None  # set once dispatched (what the worker got)


@dataclass(eq=False)
class Sequence:
    correlation_id: int | str
    queue: collections.deque[SeqItem] = field(default_factory=collections.deque)
    lane: Lane | None = None
    slot: int = -1
    busy: bool = False  # one of its requests is running
    open: bool = True  # START seen, END not yet queued: more requests without START are accepted
    dead: bool = False  # released (idle, cancelled, unloaded): never scheduled again
    single: bool = False  # a correlation-id-0 request of an iterative_sequence model: a sequence of one
    last_ns: int = 0  # last arrival or completion (idle clock)
    state: dict[str, Tensor] = field(default_factory=dict)  # implicit state inputs for the next request

    def head(self) -> SeqItem | None:
        """The next runnable request (queued requests cancelled meanwhile are dropped)."""
        queue = self.queue
        while queue and queue[0].future.done():
            queue.popleft()
        return queue[0] if queue else None


class Lane:
    """One instance's slots."""

    def __init__(self, executor: Executor, slots: int) -> None:
        self.executor = executor
        self.slots: list[Sequence | None] = [None] * slots
        self.wake = asyncio.Event()

    def free_slots(self) -> int:
        return sum(1 for s in self.slots if s is None)

    def assign(self, sequence: Sequence) -> bool:
        for i, s in enumerate(self.slots):
            if s is None:
                self.slots[i] = sequence
                sequence.lane, sequence.slot = self, i
                self.wake.set()
                return True
        return False

    def release(self, sequence: Sequence) -> None:
        if sequence.lane is self and 0 <= sequence.slot < len(self.slots) and self.slots[sequence.slot] is sequence:
            self.slots[sequence.slot] = None
        sequence.lane, sequence.slot = None, -1

    def ready_heads(self) -> list[tuple[int, SeqItem]]:
        """(slot, head request) of every slot whose sequence has a request ready to run."""
        out = []
        for i, seq in enumerate(self.slots):
            if seq is not None and not seq.busy and not seq.dead:
                head = seq.head()
                if head is not None:
                    out.append((i, head))
        return out


@dataclass(frozen=True)
class Pick:
    """What a lane should run now: `items` in batch order (direct: indexed by slot, None where a null
    request fills an empty slot); or nothing yet (empty), to retry after `wait_s` (0: on the next wake)."""

    items: list[SeqItem | None]
    wait_s: float = 0.0


def _age_s(item: SeqItem, now_ns: int) -> float:
    return (now_ns - item.request.arrival_ns) / 1e9


class DirectPolicy:
    def __init__(self, max_batch_size: int, max_queue_delay_us: int = 0, minimum_slot_utilization: float = 0.0):
        self.batched = max_batch_size > 0
        self.slots = max(1, max_batch_size)
        self.delay_s = max_queue_delay_us / 1e6
        self.min_utilization = minimum_slot_utilization

    def pick(self, lane: Lane, now_ns: int) -> Pick:
        heads = lane.ready_heads()
        if not heads:
            return Pick([])
        if self.delay_s > 0 and len(heads) / len(lane.slots) < self.min_utilization:
            waited = max(_age_s(item, now_ns) for _, item in heads)
            if waited < self.delay_s:
                return Pick([], self.delay_s - waited)
        if not self.batched:
            return Pick([heads[0][1]])
        by_slot = dict(heads)
        last = max(by_slot)
        return Pick([by_slot.get(i) for i in range(last + 1)])


class OldestPolicy:
    def __init__(self, max_batch_size: int, preferred_batch_sizes: list[int] | None = None,
                 max_queue_delay_us: int = 0, max_candidate_sequences: int = 0):
        self.max_batch = max(1, max_batch_size)
        self.slots = max_candidate_sequences if max_candidate_sequences > 0 else self.max_batch
        self.preferred = sorted(p for p in (preferred_batch_sizes or []) if 0 < p <= self.max_batch)
        self.delay_s = max_queue_delay_us / 1e6

    def pick(self, lane: Lane, now_ns: int) -> Pick:
        heads = sorted((item for _, item in lane.ready_heads()), key=lambda it: it.request.arrival_ns)
        if not heads:
            return Pick([])
        batch: list[SeqItem | None] = list(heads[: self.max_batch])
        n = len(batch)
        if n == self.max_batch or self.delay_s <= 0:
            return Pick(batch)
        waited = _age_s(heads[0], now_ns)
        if waited >= self.delay_s:
            return Pick(batch)
        fitting = [p for p in self.preferred if p <= n]
        if fitting:
            return Pick(batch[: fitting[-1]])
        return Pick([], self.delay_s - waited)


def parse_policy(config: dict[str, Any]) -> DirectPolicy | OldestPolicy:
    """The strategy of a normalised config's `sequence_batching` (direct when none is named)."""
    sb = config.get("sequence_batching") or {}
    mbs = int(config.get("max_batch_size") or 0)
    oldest = sb.get("oldest")
    if oldest is not None:
        return OldestPolicy(mbs, [int(p) for p in oldest.get("preferred_batch_size") or []],
                            int(oldest.get("max_queue_delay_microseconds") or 0),
                            int(oldest.get("max_candidate_sequences") or 0))
    direct = sb.get("direct") or {}
    return DirectPolicy(mbs, int(direct.get("max_queue_delay_microseconds") or 0),
                        float(direct.get("minimum_slot_utilization") or 0.0))
