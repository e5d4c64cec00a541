"""Priority levels and queue policies of a dynamic-batching model (Triton's ModelQueuePolicy).

Level 1 is the highest priority. A request's `priority` 0, or one above `priority_levels`, means the
model's `default_priority_level`. Each level has its own policy: `max_queue_size` (0 = unbounded,
then the server-wide --max-queue-size applies), `default_timeout_microseconds` (0 = none), whether a
request's own `timeout` may shorten it, and what an expired request gets (REJECT or DELAY).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REJECT = "REJECT"
DELAY = "DELAY"


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0 = unbounded
    default_timeout_us: int = 0  # 0 = no timeout
    allow_timeout_override: bool = False
    timeout_action: str = REJECT

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, server_max_queue_size: int = 0) -> QueuePolicy:
        d = d or {}
        action = str(d.get("timeout_action") or REJECT).upper()
        if action not in (REJECT, DELAY):
            action = REJECT
        return cls(max_queue_size=int(d.get("max_queue_size") or 0) or server_max_queue_size,
                   default_timeout_us=int(d.get("default_timeout_microseconds") or 0),
                   allow_timeout_override=bool(d.get("allow_timeout_override")),
                   timeout_action=action)

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout of a request asking for `requested_us` (0 = none asked): a request may
        only shorten a non-zero default, and only where the policy allows it (as Triton's core)."""
        if self.allow_timeout_override and 0 < requested_us < self.default_timeout_us:
            return requested_us
        return self.default_timeout_us


@dataclass(frozen=True)
class PriorityPolicy:
    """Per-level queue policies; levels are numbered 1..len(levels) (one level when none configured)."""

    levels: tuple[QueuePolicy, ...]
    default_level: int = 1
    # True when the config sets priorities, queue sizes or timeouts: requests must then wait in the
    # queue (where these apply) rather than ahead in a worker's pipeline
    holds_requests: bool = False

    @classmethod
    def from_dynamic_batching(cls, db: Mapping[str, Any], server_max_queue_size: int = 0) -> PriorityPolicy:
        count = int(db.get("priority_levels") or 0)
        default = QueuePolicy.from_json(db.get("default_queue_policy"), server_max_queue_size)
        per_level = {int(k): v for k, v in (db.get("priority_queue_policy") or {}).items()}
        holds = count > 1 or any(int(p.get("max_queue_size") or 0) or int(p.get("default_timeout_microseconds") or 0)
                                 for p in [db.get("default_queue_policy") or {}, *per_level.values()])
        if count <= 0:
            return cls((default,), 1, holds)
        levels = tuple(QueuePolicy.from_json(per_level[i], server_max_queue_size) if i in per_level else default
                       for i in range(1, count + 1))
        default_level = int(db.get("default_priority_level") or 0)
        if not 1 <= default_level <= count:
            default_level = count  # normalisation rejects this; be safe anyway
        return cls(levels, default_level, holds)

    @classmethod
    def single(cls, max_queue_size: int = 0) -> PriorityPolicy:
        return cls((QueuePolicy(max_queue_size=max_queue_size),), 1)

    def level_of(self, priority: int) -> int:
        """0-based index of the level serving a request of this `priority`."""
        if 1 <= priority <= len(self.levels):
            return priority - 1
        return self.default_level - 1
