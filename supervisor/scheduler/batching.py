"""How the dynamic batcher forms a batch (Triton's GetDynamicBatch, reference triton.md §6.2).

Walk the queue in serving order, adding requests (each worth max(1, dim 0) batch items) until the
next one would pass max_batch_size or differs from the first in a must-match input: an input with a
variable dim (-1) that does not allow ragged batching, a shape tensor, or which optional inputs are
present. The "best" prefix is the longest one whose size is a preferred size, or else the one just
before the size passes the largest preferred size. Then send
- the best prefix, unless the oldest request has waited max_queue_delay (then everything walked);
- everything walked, when it reached the largest preferred size or cannot grow (the next request
  does not fit), or when max_queue_delay is 0 or has run out;
- otherwise nothing yet: wait until the oldest request's delay runs out (or more requests arrive).
An instance already running a batch only takes batches that cannot get better by waiting (the first
two cases): that keeps the worker's pipeline full under a backlog without cutting batches short.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..inference.types import InferRequest


class Candidate(Protocol):
    items: int  # batch items this request adds
    key: Any  # requests with different keys never share a batch
    arrival_ns: int


@dataclass(frozen=True)
class Decision:
    count: int  # how many requests from the queue front to send now (0 = none)
    wait_until_ns: int = 0  # when nothing is sent: when to look again (0 = on the next arrival/completion)


@dataclass(frozen=True)
class BatchRules:
    max_items: int  # max_batch_size (1 for a model without batching)
    preferred: frozenset[int]
    max_preferred: int
    delay_ns: int
    batched: bool  # max_batch_size > 0: dim 0 of the inputs is the batch dim
    must_match: frozenset[str]  # inputs whose shape must agree within a batch
    shape_tensors: frozenset[str]  # inputs whose values must agree as well
    has_optional: bool  # which inputs are present must agree

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BatchRules:
        max_batch_size = int(config.get("max_batch_size") or 0)
        db = config.get("dynamic_batching") or {}
        max_items = max(1, max_batch_size)
        preferred = frozenset(int(s) for s in db.get("preferred_batch_size") or () if 0 < int(s) <= max_items)
        must_match, shape_tensors, has_optional = set(), set(), False
        for inp in config.get("input") or ():
            dims = inp.get("dims") or []
            if inp.get("is_shape_tensor"):
                shape_tensors.add(inp["name"])
                must_match.add(inp["name"])
            elif any(int(d) < 0 for d in dims) and not inp.get("allow_ragged_batch"):
                must_match.add(inp["name"])
            has_optional = has_optional or bool(inp.get("optional"))
        return cls(max_items=max_items, preferred=preferred, max_preferred=max(preferred, default=max_items),
                   delay_ns=int(db.get("max_queue_delay_microseconds") or 0) * 1000, batched=max_batch_size > 0,
                   must_match=frozenset(must_match), shape_tensors=frozenset(shape_tensors),
                   has_optional=has_optional)

    def items_of(self, request: InferRequest) -> int:
        if self.batched and request.inputs and request.inputs[0].shape:
            return max(1, request.inputs[0].shape[0])
        return 1

    def key_of(self, request: InferRequest) -> Any:
        """What must be equal for two requests to share a batch (None when anything goes)."""
        if not self.must_match and not self.has_optional:
            return None
        parts: list[tuple[str, Any, bytes]] = []
        for t in request.inputs:
            if t.name in self.must_match:
                shape = tuple(t.shape[1:] if self.batched else t.shape)
                value = bytes(t.data) if t.name in self.shape_tensors else b""
                parts.append((t.name, shape, value))
            elif self.has_optional:
                parts.append((t.name, None, b""))
        return tuple(sorted(parts))


_NOTHING = Decision(0)


def form_batch(rules: BatchRules, queue: Iterable[Candidate], now_ns: int, busy: bool) -> Decision:
    """Which requests at the queue front to send to an instance now (see the module docstring).
    `busy`: the instance already runs a batch."""
    if not rules.preferred:
        return _form_plain(rules, queue, now_ns, busy)
    return _form_general(rules, queue, now_ns, busy)


def _form_general(rules: BatchRules, queue: Iterable[Candidate], now_ns: int, busy: bool) -> Decision:
    """`form_batch`, every rule walked."""
    pending = count = best = 0
    key: Any = None
    oldest_ns = 0
    can_grow = True
    for c in queue:
        if count == 0:
            key, oldest_ns = c.key, c.arrival_ns
        else:
            if best == 0 and pending + c.items > rules.max_preferred:
                best = count  # past every preferred size from here: what we have is the best
            if pending + c.items > rules.max_items or c.key != key:
                can_grow = False
                break
            oldest_ns = min(oldest_ns, c.arrival_ns)
        pending += c.items
        count += 1
        if pending in rules.preferred:
            best = count
    if count == 0:
        return Decision(0)
    delay_exceeded = rules.delay_ns != 0 and now_ns - oldest_ns >= rules.delay_ns
    if best and not delay_exceeded:
        return Decision(best)
    if not can_grow or pending >= rules.max_preferred:
        return Decision(count)
    if busy:
        return Decision(0)
    if rules.delay_ns == 0 or delay_exceeded:
        return Decision(count)
    return Decision(0, oldest_ns + rules.delay_ns)


def _form_plain(rules: BatchRules, queue: Iterable[Candidate], now_ns: int, busy: bool) -> Decision:
    """`form_batch` without preferred sizes: the usual config, and a walk that runs on every event-loop
    pass with arrivals, in short. Without preferred sizes the best prefix is everything walked, which is
    sent at once when the batch cannot grow."""
    max_items = rules.max_items
    pending = count = oldest_ns = 0
    key: Any = None
    for c in queue:
        items = c.items
        if count:
            if pending + items > max_items or c.key != key:  # the batch cannot grow: send what we have
                return Decision(count)
            if c.arrival_ns < oldest_ns:
                oldest_ns = c.arrival_ns
        else:
            key, oldest_ns = c.key, c.arrival_ns
        pending += items
        count += 1
    if count == 0 or busy and pending < max_items:
        return _NOTHING
    delay_ns = rules.delay_ns
    if pending >= max_items or delay_ns == 0 or now_ns - oldest_ns >= delay_ns:
        return Decision(count)
    return Decision(0, oldest_ns + delay_ns)
