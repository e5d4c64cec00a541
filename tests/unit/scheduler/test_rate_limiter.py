"""The rate limiter on its own (scheduler/rate_limiter.py): resource counts as Triton sets them (defaults,
--rate-limit-resource, per device and global) and its load errors, grants in order of executions x
priority, a waiting instance holding back those that need its resources, release and unregister."""

from __future__ import annotations

import asyncio

import pytest
from inferd.supervisor.scheduler.rate_limiter import (
    GRANTED,
    IDLE,
    STAGED,
    ExplicitResource,
    LimiterSpec,
    RateLimiter,
    Resource,
    Ticket,
    parse_resource_flag,
)
from inferd.worker.wire.errors import ErrorCode, InferdError


def spec(*resources: tuple[str, int] | tuple[str, int, bool], priority: int = 0) -> LimiterSpec:
    return LimiterSpec(tuple(Resource(*r) for r in resources), priority)


def one(limiter: RateLimiter, owner: str, s: LimiterSpec, device: int = 0) -> Ticket:
    return limiter.register(owner, [("i0", device, s)])[0]


class Grants:
    """Records grants in order."""

    def __init__(self) -> None:
        self.order: list[Ticket] = []

    def __call__(self, ticket: Ticket) -> None:
        self.order.append(ticket)


async def settle() -> None:
    """Let the limiter's grant pass run (it runs once the current loop pass is over)."""
    for _ in range(3):
        await asyncio.sleep(0)


# ---- counts and load errors ----

def test_default_count_is_the_largest_any_instance_asks():
    limiter = RateLimiter()
    limiter.register("a", [("i0", 0, spec(("R1", 4), ("R2", 4)))])
    limiter.register("b", [("i0", 0, spec(("R2", 5), ("R3", 10), ("R4", 5)))])
    limiter.register("c", [("i0", 0, spec(("R1", 1), ("R3", 7), ("R4", 2)))])
    assert limiter.limits == {(0, "R1"): 4, (0, "R2"): 5, (0, "R3"): 10, (0, "R4"): 5}  # the docs' example


def test_explicit_counts_per_device_and_global():
    # the docs' example: --rate-limit-resource=R1:10 R2:5:0 R2:8:1 R3:2, R3 global in a model
    limiter = RateLimiter([ExplicitResource("R1", 10), ExplicitResource("R2", 5, 0), ExplicitResource("R2", 8, 1),
                           ExplicitResource("R3", 2)])
    limiter.register("a", [("i0", 0, spec(("R1", 1), ("R2", 1))), ("i1", 1, spec(("R1", 1), ("R2", 1)))])
    limiter.register("b", [("i0", 0, spec(("R3", 1, True)))])
    assert limiter.limits == {(0, "R1"): 10, (1, "R1"): 10, (0, "R2"): 5, (1, "R2"): 8, (-1, "R3"): 2}
    assert limiter.describe()["global"] == {"R3": {"count": 2, "held": 0}}


def test_a_global_resource_takes_the_largest_explicit_count_whatever_the_device():
    limiter = RateLimiter([ExplicitResource("G", 3, 7), ExplicitResource("G", 5, 2)])
    limiter.register("a", [("i0", 0, spec(("G", 1, True)))])
    assert limiter.limits == {(-1, "G"): 5}


@pytest.mark.parametrize("explicit, message", [
    ([ExplicitResource("resource1", 1)], 'Resource count for "resource1" is limited to 1 which will prevent '
     "scheduling of one or more model instances, the minimum required count is 4"),
    # given for another device only: none on this one (Triton's L0_rate_limiter case 3)
    ([ExplicitResource("resource1", 10, 10)], 'Resource count for "resource1" is limited to 0 which will '
     "prevent scheduling of one or more model instances, the minimum required count is 4"),
    # with any explicit resource, one it does not name has none
    ([ExplicitResource("other", 10)], 'Resource count for "resource1" is limited to 0 which will prevent '
     "scheduling of one or more model instances, the minimum required count is 4"),
])
def test_too_few_explicit_copies_fail_the_registration_with_tritons_message(explicit, message):
    limiter = RateLimiter(explicit)
    with pytest.raises(InferdError) as info:
        limiter.register("m", [("i0", 0, spec(("resource1", 4)))])
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == message
    assert limiter.limits == {} and not limiter._tickets  # nothing of it stays registered


def test_a_resource_both_global_and_per_device_fails_the_second_model():
    limiter = RateLimiter()
    limiter.register("v2", [("i0", 0, spec(("resource2", 2, True)))])
    with pytest.raises(InferdError) as info:
        limiter.register("v3", [("i0", 0, spec(("resource2", 2, False)))])
    assert info.value.message == ('Resource "resource2" is present as both global and device-specific resource '
                                  "in the model configuration.")
    assert limiter.limits == {(-1, "resource2"): 2}


def test_unregistering_recomputes_the_default_counts():
    limiter = RateLimiter()
    big = limiter.register("big", [("i0", 0, spec(("R", 4)))])
    limiter.register("small", [("i0", 0, spec(("R", 1)))])
    assert limiter.limits == {(0, "R"): 4}
    limiter.unregister(big)
    assert limiter.limits == {(0, "R"): 1}


def test_spec_from_the_config_json():
    s = LimiterSpec.from_config({"resources": [{"name": "R1", "global": False, "count": 4},
                                               {"name": "R2", "global": True, "count": 2}], "priority": 2})
    assert s == LimiterSpec((Resource("R1", 4), Resource("R2", 2, True)), 2)
    assert LimiterSpec.from_config({}) == LimiterSpec()


@pytest.mark.parametrize("text, parsed", [
    ("R1:10", ExplicitResource("R1", 10)),
    ("R2:5:0", ExplicitResource("R2", 5, 0)),
    ("Mixed_Case:3:1", ExplicitResource("Mixed_Case", 3, 1)),  # names as given (tritonserver passes them so)
])
def test_resource_flag(text, parsed):
    assert parse_resource_flag(text) == parsed


@pytest.mark.parametrize("text", ["R1", "R1:2:3:4", "R1:x", "R1:2:y", "R1:-1"])
def test_bad_resource_flags_get_tritons_message(text):
    with pytest.raises(ValueError, match="--rate-limit-resource option format is '<resource_name>:<count>:<device>' "
                                         "or '<resource_name>:<count>'. Got " + text):
        parse_resource_flag(text)


# ---- grants ----

async def test_one_copy_is_held_by_one_instance_at_a_time_and_never_granted_within_request():
    limiter = RateLimiter()
    a, b = one(limiter, "a", spec(("R", 1))), one(limiter, "b", spec(("R", 1)))
    grants = Grants()
    limiter.request(a, grants)
    limiter.request(b, grants)
    assert grants.order == [] and a.state == b.state == STAGED
    await settle()
    assert grants.order == [a] and a.state == GRANTED and b.state == STAGED
    assert limiter.held == {(0, "R"): 1}
    limiter.release(a)
    await settle()
    assert grants.order == [a, b] and a.state == IDLE and a.executions == 1


async def test_per_device_copies_do_not_contend_but_global_ones_do():
    limiter = RateLimiter()
    local = limiter.register("local", [("i0", 0, spec(("R", 1))), ("i1", 1, spec(("R", 1)))])
    shared = limiter.register("shared", [("i0", 0, spec(("G", 1, True))), ("i1", 1, spec(("G", 1, True)))])
    grants = Grants()
    for t in local + shared:
        limiter.request(t, grants)
    await settle()
    assert grants.order == local + shared[:1]
    limiter.release(shared[0])
    await settle()
    assert grants.order[-1] is shared[1]


async def test_priority_2_gets_half_the_turns_of_priority_1():
    limiter = RateLimiter()
    fast, slow = one(limiter, "fast", spec(("R", 1))), one(limiter, "slow", spec(("R", 1), priority=2))
    turns: list[str] = []

    def granted(ticket: Ticket) -> None:
        turns.append("f" if ticket is fast else "s")
        asyncio.get_running_loop().call_soon(again, ticket)

    def again(ticket: Ticket) -> None:  # the execution ends; the instance has more work at once
        limiter.release(ticket)
        limiter.request(ticket, granted)

    limiter.request(fast, granted)
    limiter.request(slow, granted)
    while len(turns) < 60:
        await asyncio.sleep(0)
    f, s = turns[:60].count("f"), turns[:60].count("s")
    assert (f, s) in ((40, 20), (39, 21), (41, 19)), turns
    for t in (fast, slow):
        limiter.withdraw(t)
    limiter.unregister([fast, slow])


async def test_priority_0_counts_as_1_and_ties_go_to_the_first_staged():
    limiter = RateLimiter()
    a, b = one(limiter, "a", spec(("R", 1), priority=0)), one(limiter, "b", spec(("R", 1), priority=1))
    a.executions = b.executions = 3
    assert a.score == b.score == 3
    grants = Grants()
    limiter.request(b, grants)
    limiter.request(a, grants)
    await settle()
    assert grants.order == [b]


async def test_a_waiting_instance_holds_back_later_ones_needing_its_resources_only():
    limiter = RateLimiter()
    small1 = one(limiter, "s1", spec(("R", 1)))
    big = one(limiter, "big", spec(("R", 2)))
    small2 = one(limiter, "s2", spec(("R", 1)))
    other = one(limiter, "other", spec(("Q", 1)))
    small2.executions = other.executions = 5  # they come after `big` in order
    grants = Grants()
    limiter.request(small1, grants)
    await settle()
    limiter.request(big, grants)
    limiter.request(small2, grants)
    limiter.request(other, grants)
    await settle()
    # one copy of R is free, but `big` (first in order) needs two: small2 waits behind it, `other` goes on
    assert grants.order == [small1, other] and big.state == small2.state == STAGED
    limiter.release(small1)
    await settle()
    assert grants.order == [small1, other, big]


async def test_an_instance_without_resources_is_granted_at_once():
    limiter = RateLimiter()
    holder, free = one(limiter, "h", spec(("R", 1))), one(limiter, "f", spec(priority=3))
    grants = Grants()
    limiter.request(holder, grants)
    limiter.request(free, grants)
    await settle()
    assert grants.order == [holder, free]


async def test_withdraw_and_unused_grants():
    limiter = RateLimiter()
    a, b = one(limiter, "a", spec(("R", 1))), one(limiter, "b", spec(("R", 1)))
    grants = Grants()
    limiter.request(a, grants)
    limiter.withdraw(a)
    limiter.request(b, grants)
    await settle()
    assert grants.order == [b] and a.state == IDLE
    limiter.release(b, executed=False)
    assert b.executions == 0 and limiter.held == {(0, "R"): 0}
    limiter.request(a, grants)
    with pytest.raises(RuntimeError, match="asked for its resources twice"):
        limiter.request(a, grants)


async def test_unregister_frees_what_the_instances_held_and_drops_what_they_waited_for():
    limiter = RateLimiter()
    gone = limiter.register("gone", [("i0", 0, spec(("R", 1))), ("i1", 0, spec(("R", 1)))])
    stays = one(limiter, "stays", spec(("R", 1)))
    grants = Grants()
    limiter.request(gone[0], grants)
    await settle()
    limiter.request(gone[1], grants)
    limiter.request(stays, grants)
    limiter.unregister(gone)
    await settle()
    assert grants.order == [gone[0], stays] and limiter.held == {(0, "R"): 1}
    limiter.release(gone[0])  # answered after its model was unloaded: nothing happens
    assert limiter.held == {(0, "R"): 1}


async def test_a_failing_grant_callback_gives_the_resources_back():
    limiter = RateLimiter()
    a, b = one(limiter, "a", spec(("R", 1))), one(limiter, "b", spec(("R", 1)))
    grants = Grants()

    def broken(ticket: Ticket) -> None:
        raise RuntimeError("scheduler bug")

    limiter.request(a, broken)
    limiter.request(b, grants)
    await settle()
    assert a.state == IDLE and a.executions == 0 and grants.order == [b]
