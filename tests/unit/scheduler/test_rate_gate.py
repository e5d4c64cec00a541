"""The schedulers under the rate limiter (scheduler/rate_gate.py): the default scheduler, the dynamic batcher
and the sequence batcher of two models sharing one resource never run at once, the wait counts as queue
time, a batch formed after the grant takes the requests that came meanwhile, unlimited instances are not
held back, and a closed model gives its place up."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from inferd.supervisor.inference.types import SEQUENCE_START, InferRequest, Tensor
from inferd.supervisor.scheduler.batching import BatchRules
from inferd.supervisor.scheduler.default import DefaultScheduler
from inferd.supervisor.scheduler.dynamic import DynamicBatcher
from inferd.supervisor.scheduler.policy import PriorityPolicy
from inferd.supervisor.scheduler.rate_gate import RateGate
from inferd.supervisor.scheduler.rate_limiter import LimiterSpec, RateLimiter, Resource
from inferd.supervisor.scheduler.sequence.scheduler import SequenceScheduler
from inferd.worker.wire.errors import InferdError

from .fakes import WAIT_S, HeldExecutor, Stats, until
from .sequence.test_scheduler import CONTROLS
from .sequence.test_scheduler import HeldExecutor as SeqExecutor

ONE_R = LimiterSpec((Resource("R", 1),))


class QueueStats(Stats):
    """Stats that keep each request's queue time (start of its execution - arrival), in ns."""

    def __init__(self) -> None:
        super().__init__()
        self.queue_ns: list[int] = []

    def record_successes(self, arrivals: Any, start_ns: int, *args: Any) -> None:
        super().record_successes(arrivals)
        self.queue_ns.extend(start_ns - a for a in arrivals)

    def record_success(self, batch_items: int, request_ns: int, queue_ns: int, *args: Any) -> None:
        super().record_success()
        self.queue_ns.append(queue_ns)


@pytest.fixture
async def made():
    schedulers: list[Any] = []
    yield schedulers
    for s in schedulers:
        await s.close()


def gate_for(limiter: RateLimiter, model: str, executors: list[Any], spec: LimiterSpec = ONE_R) -> RateGate:
    tickets = limiter.register(model, [(e.name, 0, spec) for e in executors])
    return RateGate(limiter, list(zip(executors, tickets)))


def default(made, limiter, name, executors, limited=None, runners=4):
    stats = QueueStats()
    gate = gate_for(limiter, name, executors if limited is None else limited)
    s = DefaultScheduler(name, executors, stats, max_queue_size=0, runners_per_instance=runners, gate=gate)
    s.start()
    made.append(s)
    return s, stats


def dynamic(made, limiter, name, executors):
    config = {"max_batch_size": 8, "dynamic_batching": {}, "input": [{"name": "X", "dims": [-1]}]}
    stats = QueueStats()
    s = DynamicBatcher(name, executors, stats, BatchRules.from_config(config),
                       PriorityPolicy.from_dynamic_batching({}, 0), depth=4, gate=gate_for(limiter, name, executors))
    s.start()
    made.append(s)
    return s, stats


def request(model: str, rid: str) -> InferRequest:
    return InferRequest(model, id=rid, inputs=[Tensor("X", "FP32", [1, 2], b"\0" * 8)])


async def test_two_models_sharing_one_copy_take_turns_and_the_wait_is_queue_time(made):
    limiter = RateLimiter()
    a_ex, b_ex = HeldExecutor("a0"), HeldExecutor("b0")
    a, a_stats = default(made, limiter, "a", [a_ex])
    b, b_stats = default(made, limiter, "b", [b_ex])
    fa = a.submit(request("a", "a1"))
    await until(lambda: a_ex.batches, "a's batch")
    fb = b.submit(request("b", "b1"))
    await asyncio.sleep(0.05)  # b waits for R all this time
    assert b_ex.batches == []
    a_ex.release(0)
    await fa
    await until(lambda: b_ex.batches, "b's batch once a gave R back")
    b_ex.release(0)
    await fb
    assert b_stats.queue_ns[0] >= 50_000_000 > a_stats.queue_ns[0]
    assert limiter.held == {(0, "R"): 0}


async def test_a_limited_instance_runs_one_batch_at_a_time_whatever_the_pipeline_depth(made):
    limiter = RateLimiter()
    ex = HeldExecutor("a0")
    a, _ = default(made, limiter, "a", [ex], runners=8)
    futures = [a.submit(request("a", str(i))) for i in range(3)]
    await until(lambda: ex.batches, "the first batch")
    await asyncio.sleep(0.02)
    assert ex.batches == [["0"]]
    for i in range(3):
        await until(lambda i=i: len(ex.batches) > i, f"batch {i}")
        ex.release(i)
    await asyncio.gather(*futures)
    assert ex.batches == [["0"], ["1"], ["2"]]


async def test_unlimited_instances_of_the_model_are_not_held_back(made):
    limiter = RateLimiter()
    holder_ex = HeldExecutor("h0")
    holder, _ = default(made, limiter, "holder", [holder_ex])
    limited, free = HeldExecutor("a0"), HeldExecutor("a1")
    a, _ = default(made, limiter, "a", [limited, free], limited=[limited], runners=1)
    fh = holder.submit(request("holder", "h"))
    await until(lambda: holder_ex.batches, "the holder runs (R held)")
    futures = [a.submit(request("a", str(i))) for i in range(2)]
    await until(lambda: free.batches, "the unlimited instance takes one at once")
    await asyncio.sleep(0.02)
    assert limited.batches == [] and free.batches == [["0"]]
    holder_ex.release(0)
    await until(lambda: limited.batches, "the limited instance once R is free")
    limited.release(0)
    free.release(0)
    await asyncio.gather(fh, *futures)


async def test_a_dynamic_batch_formed_on_the_grant_takes_the_requests_that_came_meanwhile(made):
    limiter = RateLimiter()
    holder_ex, ex = HeldExecutor("h0"), HeldExecutor("d0")
    holder, _ = default(made, limiter, "holder", [holder_ex])
    d, stats = dynamic(made, limiter, "d", [ex])
    fh = holder.submit(request("holder", "h"))
    await until(lambda: holder_ex.batches, "the holder runs")
    first = d.submit(request("d", "0"))
    await asyncio.sleep(0.02)
    rest = [d.submit(request("d", str(i))) for i in range(1, 4)]
    await asyncio.sleep(0.02)
    assert ex.batches == []
    holder_ex.release(0)
    await until(lambda: ex.batches, "the batch once R is free")
    assert ex.batches == [["0", "1", "2", "3"]]
    ex.release(0)
    await asyncio.gather(fh, first, *rest)
    assert min(stats.queue_ns) >= 20_000_000


async def test_dynamic_batcher_and_default_scheduler_alternate_under_load(made):
    limiter = RateLimiter()
    a_ex, d_ex = HeldExecutor("a0"), HeldExecutor("d0")
    a, _ = default(made, limiter, "a", [a_ex])
    d, _ = dynamic(made, limiter, "d", [d_ex])
    fa = [a.submit(request("a", f"a{i}")) for i in range(3)]
    fd = [d.submit(request("d", f"d{i}")) for i in range(3)]
    running: list[str] = []
    for _ in range(4):
        await until(lambda: sum(len(x.batches) for x in (a_ex, d_ex)) > len(running), "the next batch")
        await asyncio.sleep(0.01)  # nothing else starts meanwhile
        started = [(x, i) for x in (a_ex, d_ex) for i, g in enumerate(x._gates) if not g.done()]
        assert len(started) == 1, "two executions hold R at once"
        x, i = started[0]
        running.append(x.name)
        x.release(i)
    await asyncio.wait_for(asyncio.gather(*fa, *fd), WAIT_S)
    assert set(running) == {"a0", "d0"}


async def test_a_closed_model_gives_its_place_up(made):
    limiter = RateLimiter()
    holder_ex, a_ex, b_ex = HeldExecutor("h0"), HeldExecutor("a0"), HeldExecutor("b0")
    holder, _ = default(made, limiter, "holder", [holder_ex])
    a, _ = default(made, limiter, "a", [a_ex])
    b, _ = default(made, limiter, "b", [b_ex])
    fh = holder.submit(request("holder", "h"))
    await until(lambda: holder_ex.batches, "the holder runs")
    fa = a.submit(request("a", "a"))
    fb = b.submit(request("b", "b"))
    await a.close()
    with pytest.raises(InferdError, match="unloaded"):
        await fa
    holder_ex.release(0)
    await until(lambda: b_ex.batches, "b runs")
    b_ex.release(0)
    await asyncio.gather(fh, fb)
    assert a_ex.batches == []


async def test_the_sequence_batcher_waits_for_its_resources(made):
    limiter = RateLimiter()
    holder_ex = HeldExecutor("h0")
    holder, _ = default(made, limiter, "holder", [holder_ex])
    seq_ex = SeqExecutor("s0")
    config = {"name": "s", "max_batch_size": 2, "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
              "sequence_batching": dict(CONTROLS, max_sequence_idle_microseconds=60_000_000, direct={})}
    stats = QueueStats()
    s = SequenceScheduler("s", config, [seq_ex], stats, gate=gate_for(limiter, "s", [seq_ex]))
    s.start()
    made.append(s)
    fh = holder.submit(request("holder", "h"))
    await until(lambda: holder_ex.batches, "the holder runs")
    fs = s.submit(InferRequest("s", inputs=[Tensor("INPUT", "INT32", [1, 1], struct.pack("<i", 5))],
                               correlation_id=7, flags=SEQUENCE_START))
    await asyncio.sleep(0.05)
    assert seq_ex.batches == []
    holder_ex.release(0)
    await seq_ex.wait_batches(1)
    assert limiter.held == {(0, "R"): 1}
    seq_ex.release_all()
    await asyncio.wait_for(fs, WAIT_S)
    await fh
    assert stats.queue_ns[0] >= 50_000_000
    await until(lambda: limiter.held == {(0, "R"): 0}, "R given back")
