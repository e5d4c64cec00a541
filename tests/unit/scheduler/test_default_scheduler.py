"""DefaultScheduler (no dynamic_batching): one request per execution in arrival order, pipelined up to
the runners per instance; Triton's queue-full answer; no queue timeouts without a queue policy."""

from __future__ import annotations

import asyncio

import pytest
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.supervisor.scheduler.default import DefaultScheduler
from inferd.worker.wire.errors import ErrorCode, InferdError

from .fakes import HeldExecutor, Result, Stats, release_when_sent, until


@pytest.fixture
async def made():
    schedulers: list[DefaultScheduler] = []
    yield schedulers
    for s in schedulers:
        await s.close()


def make(made, executors, max_queue_size=0, runners=1):
    stats = Stats()
    scheduler = DefaultScheduler("m", executors, stats, max_queue_size=max_queue_size, batched=True,
                                 runners_per_instance=runners)
    scheduler.start()
    made.append(scheduler)
    return scheduler, stats


def request(rid: str, **kw) -> InferRequest:
    return InferRequest("m", id=rid, inputs=[Tensor("X", "FP32", [2, 4], b"\0" * 32)], **kw)


async def test_one_request_per_execution_in_arrival_order(made):
    ex = HeldExecutor("a")
    scheduler, stats = make(made, [ex], runners=2)
    futures = [scheduler.submit(request(str(i))) for i in range(3)]
    await until(lambda: len(ex.batches) == 2, "two pipelined executions")
    assert ex.batches == [["0"], ["1"]]
    for i in range(3):
        await release_when_sent(ex, i)
    await asyncio.gather(*futures)
    assert ex.batches == [["0"], ["1"], ["2"]]
    assert stats.executions == [2, 2, 2]  # batch items: dim 0 of each request


async def test_request_timeout_is_ignored_without_a_queue_policy(made):
    ex = HeldExecutor("a")
    scheduler, stats = make(made, [ex])
    first = scheduler.submit(request("first"))
    await until(lambda: ex.batches, "the first execution")
    queued = scheduler.submit(request("queued", timeout_us=1000))
    await asyncio.sleep(0.05)  # well past its 1 ms: still queued, as in Triton
    assert not queued.done() and stats.failures == []
    ex.release(0)
    await release_when_sent(ex, 1)
    await asyncio.gather(first, queued)


async def test_full_queue_is_unavailable_in_tritons_words(made):
    ex = HeldExecutor("a")
    scheduler, stats = make(made, [ex], max_queue_size=1)
    scheduler.submit(request("run"))
    await until(lambda: ex.batches, "the first execution")
    scheduler.submit(request("queued"))
    with pytest.raises(InferdError) as info:
        scheduler.submit(request("over"))
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.message == "[request id: over] Exceeds maximum queue size"
    assert stats.failures == ["REJECTED"]


async def test_cancelled_while_queued_never_runs(made):
    ex = HeldExecutor("a")
    scheduler, stats = make(made, [ex])
    first = scheduler.submit(request("first"))
    await until(lambda: ex.batches, "the first execution")
    queued = scheduler.submit(request("queued"))
    queued.cancel()
    await asyncio.sleep(0)
    assert scheduler.pending_count == 0 and stats.failures == ["CANCELED"]
    ex.release(0)
    await first
    assert ex.batches == [["first"]]


async def test_new_requests_go_to_the_least_busy_instance(made):
    # each instance has 4 pipeline slots: a FIFO wake-up could hand work to a busy instance's free slot
    a, b = HeldExecutor("a"), HeldExecutor("b")
    scheduler, _ = make(made, [a, b], runners=4)
    futures = [scheduler.submit(request("r0"))]
    await until(lambda: len(a.batches) + len(b.batches) == 1, "the first execution")
    busy, idle = (a, b) if a.batches else (b, a)
    for i in range(1, 6):  # the next ones alternate: each goes where fewer requests are held
        futures.append(scheduler.submit(request(f"r{i}")))
        await until(lambda i=i: len(a.batches) + len(b.batches) == i + 1, f"execution {i}")
    assert [len(idle.batches), len(busy.batches)] == [3, 3]
    assert idle.batches[0] == ["r1"]  # the second request went to the idle instance, not behind r0
    for ex in (a, b):
        for k in range(len(ex.batches)):
            ex.release(k)
    await asyncio.gather(*futures)


class ImmediateExecutor(HeldExecutor):
    """Records a batch the moment it is launched (as Instance.launch sends its Execute at once)."""

    def launch(self, requests):
        self.batches.append([r.id for r in requests])
        gate = asyncio.get_running_loop().create_future()
        self._gates.append(gate)
        done = asyncio.get_running_loop().create_future()
        gate.add_done_callback(lambda _: done.set_result(Result([InferResponse("m", "1", id=r.id) for r in requests])))
        return done


async def test_a_request_goes_out_within_submit_and_the_next_within_the_completion(made):
    # no runner task in between: the Execute of a request that finds room leaves before submit returns,
    # and a queued one leaves in the callback that answers the previous one
    ex = ImmediateExecutor("a")
    scheduler, stats = make(made, [ex], runners=1)
    first = scheduler.submit(request("first"))
    assert ex.batches == [["first"]]
    second = scheduler.submit(request("second"))
    assert ex.batches == [["first"]] and scheduler.pending_count == 1
    ex.release(0)
    await first
    assert ex.batches == [["first"], ["second"]]  # sent before the first answer reached its caller
    ex.release(1)
    await second
    assert stats.successes == 2
