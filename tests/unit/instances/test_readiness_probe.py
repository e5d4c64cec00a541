"""The supervisor's side of a model's is_ready() (instances/readiness.py): python_backend's rules of one check
in flight per instance, a timeout per request, and later requests taking the in-flight check's answer."""

from __future__ import annotations

import asyncio

from inferd.supervisor.instances.readiness import WorkerReadiness
from inferd.worker.wire import messages as m


def probes() -> tuple[WorkerReadiness, list]:
    sent: list = []
    state = WorkerReadiness(sent.append)
    return state, sent


async def sent_count(sent: list, n: int) -> None:
    """Let the checks run until `n` probes went out."""
    while len(sent) < n:
        await asyncio.sleep(0)


async def test_a_probe_waits_for_the_sockets_greeting_then_asks():
    state, sent = probes()
    check = asyncio.ensure_future(state.check(timeout=5))
    await asyncio.sleep(0)
    assert sent == []  # the worker's socket has not greeted yet
    state.on_result(m.ReadinessResult(0))
    await sent_count(sent, 1)
    assert sent == [m.ReadinessProbe(1)]
    state.on_result(m.ReadinessResult(1, True))
    assert await check == (True, "")


async def test_false_and_errors_are_not_ready():
    state, sent = probes()
    state.on_result(m.ReadinessResult(0))
    check = asyncio.ensure_future(state.check())
    await sent_count(sent, 1)
    state.on_result(m.ReadinessResult(1, False))
    assert await check == (False, "")
    check = asyncio.ensure_future(state.check())
    await sent_count(sent, 2)
    state.on_result(m.ReadinessResult(2, False, m.WireError(13, "RuntimeError: down")))
    assert await check == (False, "RuntimeError: down")
    assert sent == [m.ReadinessProbe(1), m.ReadinessProbe(2)]


async def test_a_late_check_is_not_ready_and_the_next_request_takes_its_answer():
    state, sent = probes()
    state.on_result(m.ReadinessResult(0))
    assert await state.check(timeout=0.01) == (False, "Timed out waiting for user-defined is_ready() response")
    second = asyncio.ensure_future(state.check(timeout=5))
    await asyncio.sleep(0)
    assert sent == [m.ReadinessProbe(1)]  # no second probe while the first runs
    state.on_result(m.ReadinessResult(1, True))
    assert await second == (True, "")
    third = asyncio.ensure_future(state.check(timeout=5))  # a new request: a new check
    await sent_count(sent, 2)
    assert sent == [m.ReadinessProbe(1), m.ReadinessProbe(2)]
    state.on_result(m.ReadinessResult(2, True))
    assert await third == (True, "")


async def test_waiting_on_an_in_flight_check_times_out_too():
    state, sent = probes()
    state.on_result(m.ReadinessResult(0))
    first = asyncio.ensure_future(state.check(timeout=5))
    await sent_count(sent, 1)
    assert await state.check(timeout=0.01) == (False, "Timed out waiting for in-flight is_ready() response")
    state.on_result(m.ReadinessResult(1, True))
    assert await first == (True, "")


async def test_a_stale_answer_is_ignored_and_a_dead_worker_is_not_ready():
    state, sent = probes()
    state.on_result(m.ReadinessResult(0))
    check = asyncio.ensure_future(state.check(timeout=5))
    await sent_count(sent, 1)
    state.on_result(m.ReadinessResult(7, True))  # not the probe asked
    assert not check.done()
    state.gone("the worker exited")
    assert await check == (False, "the worker exited")


async def test_a_worker_that_never_greets_is_not_ready_in_time():
    state, sent = probes()
    assert await state.check(timeout=0.01) == (False, "Timed out waiting for user-defined is_ready() response")
    assert sent == []
