"""Priority levels and queue policies (scheduler.policy) and the per-level queue (scheduler.queue)."""

from __future__ import annotations

from inferd.supervisor.scheduler.policy import DELAY, REJECT, PriorityPolicy, QueuePolicy
from inferd.supervisor.scheduler.queue import PriorityQueue


def test_no_levels_means_one_level_with_the_default_policy():
    p = PriorityPolicy.from_dynamic_batching({"default_queue_policy": {"max_queue_size": 3}})
    assert len(p.levels) == 1 and p.levels[0].max_queue_size == 3
    assert p.level_of(0) == p.level_of(1) == p.level_of(7) == 0


def test_levels_use_their_own_policy_or_the_default_one():
    p = PriorityPolicy.from_dynamic_batching({
        "priority_levels": 3, "default_priority_level": 2,
        "default_queue_policy": {"max_queue_size": 5, "timeout_action": "DELAY"},
        "priority_queue_policy": {"1": {"max_queue_size": 1, "default_timeout_microseconds": 10}}})
    assert [q.max_queue_size for q in p.levels] == [1, 5, 5]
    assert p.levels[0].timeout_action == REJECT and p.levels[1].timeout_action == DELAY
    assert p.level_of(1) == 0 and p.level_of(3) == 2
    assert p.level_of(0) == p.level_of(4) == 1  # 0 and out-of-range priorities: the default level


def test_server_wide_bound_applies_where_the_policy_sets_none():
    p = PriorityPolicy.from_dynamic_batching({}, server_max_queue_size=4096)
    assert p.levels[0].max_queue_size == 4096


def test_timeout_override_only_shortens_a_nonzero_default_when_allowed():
    assert QueuePolicy(default_timeout_us=100, allow_timeout_override=True).timeout_us(40) == 40
    assert QueuePolicy(default_timeout_us=100, allow_timeout_override=True).timeout_us(400) == 100
    assert QueuePolicy(default_timeout_us=100, allow_timeout_override=True).timeout_us(0) == 100
    assert QueuePolicy(default_timeout_us=100).timeout_us(40) == 100
    assert QueuePolicy(default_timeout_us=0, allow_timeout_override=True).timeout_us(40) == 0


def test_priority_queue_serves_levels_in_order_and_delayed_last_within_a_level():
    q: PriorityQueue[str] = PriorityQueue([0, 2])
    for level, item in [(1, "low1"), (0, "high1"), (1, "low2"), (0, "high2")]:
        q.put(level, item)
    assert list(q) == ["high1", "high2", "low1", "low2"]
    assert q.full(1) and not q.full(0)
    assert q.delay(0, "high1")
    assert list(q) == ["high2", "high1", "low1", "low2"]
    assert q.first() == "high2"
    assert q.remove(1, "low1") and not q.remove(1, "low1")
    assert q.pop_front(3) == ["high2", "high1", "low2"]
    assert len(q) == 0 and q.first() is None


def test_priority_queue_drain_empties_every_level():
    q: PriorityQueue[int] = PriorityQueue([0, 0])
    q.put(0, 1)
    q.put(1, 2)
    q.delay(1, 2)
    assert sorted(q.drain()) == [1, 2] and len(q) == 0 and list(q) == []


def test_policies_that_need_requests_to_stay_queued_are_flagged():
    assert not PriorityPolicy.from_dynamic_batching({}, server_max_queue_size=4096).holds_requests
    assert not PriorityPolicy.from_dynamic_batching({"priority_levels": 1, "default_priority_level": 1}).holds_requests
    for db in ({"priority_levels": 2, "default_priority_level": 1},
               {"default_queue_policy": {"max_queue_size": 2}},
               {"default_queue_policy": {"default_timeout_microseconds": 5}},
               {"priority_levels": 1, "default_priority_level": 1,
                "priority_queue_policy": {"1": {"max_queue_size": 3}}}):
        assert PriorityPolicy.from_dynamic_batching(db).holds_requests, db
