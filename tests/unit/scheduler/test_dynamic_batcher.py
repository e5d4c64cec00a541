"""DynamicBatcher over in-process executors that hold each batch until the test releases it: when
batches form, how they spread, answer order, cancellation, queue limits and timeouts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.supervisor.scheduler.batching import BatchRules
from inferd.supervisor.scheduler.dynamic import DynamicBatcher
from inferd.supervisor.scheduler.policy import PriorityPolicy
from inferd.worker.wire.errors import ErrorCode, InferdError

from .fakes import WAIT_S, HeldExecutor, Result, Stats, release_when_sent, until

_made: list[DynamicBatcher] = []


@pytest.fixture(autouse=True)
async def close_batchers():
    yield
    while _made:
        await _made.pop().close()  # batches a test left held are cancelled


def make(executors, max_batch_size=8, db=None, depth=1, server_max_queue_size=0):
    db = db or {}
    config = {"max_batch_size": max_batch_size, "dynamic_batching": db,
              "input": [{"name": "X", "dims": [-1]}]}
    stats = Stats()
    batcher = DynamicBatcher("m", executors, stats, BatchRules.from_config(config),
                             PriorityPolicy.from_dynamic_batching(db, server_max_queue_size),
                             preserve_ordering=bool(db.get("preserve_ordering")), depth=depth)
    batcher.start()
    _made.append(batcher)
    return batcher, stats


def request(rid: str, cols: int = 2, **kw: Any) -> InferRequest:
    return InferRequest("m", id=rid, inputs=[Tensor("X", "FP32", [1, cols], b"\0" * 4 * cols)], **kw)


async def test_requests_arriving_together_share_one_batch():
    ex = HeldExecutor("a")
    batcher, stats = make([ex])
    futures = [batcher.submit(request(str(i))) for i in range(5)]
    await until(lambda: ex.batches, "a batch")
    assert ex.batches == [["0", "1", "2", "3", "4"]]
    ex.release()
    assert [f.id for f in await asyncio.gather(*futures)] == ["0", "1", "2", "3", "4"]
    assert stats.executions == [5] and stats.successes == 5


async def test_busy_instance_gets_the_next_batch_only_when_free_so_it_grows():
    ex = HeldExecutor("a")
    batcher, _ = make([ex], depth=4)
    first = batcher.submit(request("first"))
    await until(lambda: ex.batches, "the first batch")
    later = [batcher.submit(request(str(i))) for i in range(3)]
    await asyncio.sleep(0.01)
    assert len(ex.batches) == 1  # not sent ahead in small pieces while the instance is busy
    ex.release(0)
    await until(lambda: len(ex.batches) == 2, "the second batch")
    assert ex.batches[1] == ["0", "1", "2"]
    ex.release(1)
    await asyncio.gather(first, *later)


async def test_full_batches_are_pipelined_to_a_busy_instance():
    ex = HeldExecutor("a")
    batcher, _ = make([ex], max_batch_size=2, depth=2)
    futures = [batcher.submit(request(str(i))) for i in range(6)]
    await until(lambda: len(ex.batches) == 2, "two full batches")
    await asyncio.sleep(0.01)
    assert ex.batches == [["0", "1"], ["2", "3"]]  # depth 2: the third waits
    ex.release(0)
    await until(lambda: len(ex.batches) == 3, "the third batch")
    ex.release(1)
    ex.release(2)
    await asyncio.gather(*futures)


async def test_batches_spread_over_instances():
    a, b = HeldExecutor("a"), HeldExecutor("b")
    batcher, _ = make([a, b], max_batch_size=2)
    futures = [batcher.submit(request(str(i))) for i in range(4)]
    await until(lambda: a.batches and b.batches, "one batch on each instance")
    assert sorted(a.batches + b.batches) == [["0", "1"], ["2", "3"]]
    a.release()
    b.release()
    await asyncio.gather(*futures)


async def test_different_shapes_never_share_a_batch():
    ex = HeldExecutor("a")
    batcher, _ = make([ex], depth=4)
    futures = [batcher.submit(request(str(i), cols=2 + i % 2)) for i in range(4)]
    await until(lambda: ex.batches, "a batch")
    ex.release(0)
    for i in range(1, 4):
        await release_when_sent(ex, i)
    await asyncio.gather(*futures)
    assert ex.batches == [["0"], ["1"], ["2"], ["3"]]


async def test_preserve_ordering_holds_later_answers_until_earlier_ones_are_out():
    a, b = HeldExecutor("a"), HeldExecutor("b")
    batcher, _ = make([a, b], max_batch_size=1, db={"preserve_ordering": True})
    first = batcher.submit(request("1"))
    second = batcher.submit(request("2"))
    await until(lambda: a.batches and b.batches, "both dispatched")
    (a if a.batches == [["2"]] else b).release()
    await asyncio.sleep(0.01)
    assert not second.done()
    (a if a.batches == [["1"]] else b).release()
    await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)


async def test_cancel_while_queued_leaves_the_queue_and_while_running_tells_the_instance():
    ex = HeldExecutor("a")
    batcher, stats = make([ex], max_batch_size=1)
    running = batcher.submit(request("run"))
    queued = batcher.submit(request("queued"))
    await until(lambda: ex.batches, "the first batch")
    queued.cancel()
    running.cancel()
    await asyncio.sleep(0)
    assert batcher.pending_count == 0 and stats.failures == ["CANCELED"]
    assert ex.cancelled == ["run"]
    ex.release()
    await until(lambda: batcher.running == 0, "the batch to finish")
    assert stats.failures == ["CANCELED", "CANCELED"] and ex.batches == [["run"]]


async def test_cancelling_the_task_awaiting_a_queued_request_withdraws_it():
    # the path of a client timeout or a dropped stream: the awaiting task is cancelled, not the future
    ex = HeldExecutor("a")
    batcher, stats = make([ex], max_batch_size=1)
    running = batcher.submit(request("run"))
    await until(lambda: ex.batches, "the first batch")

    async def caller() -> object:
        return await batcher.submit(request("queued"))

    task = asyncio.ensure_future(caller())
    await until(lambda: batcher.pending_count == 1, "the request to queue")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert batcher.pending_count == 0 and stats.failures == ["CANCELED"]
    ex.release()
    await asyncio.wait_for(running, WAIT_S)
    assert ex.batches == [["run"]]


async def test_queue_full_is_unavailable():
    ex = HeldExecutor("a")
    batcher, stats = make([ex], max_batch_size=1, db={"default_queue_policy": {"max_queue_size": 1}})
    batcher.submit(request("run"))
    await until(lambda: ex.batches, "the first batch")
    batcher.submit(request("queued"))
    with pytest.raises(InferdError) as info:
        batcher.submit(request("over"))
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.message == "[request id: over] Exceeds maximum queue size"  # Triton's words
    assert stats.failures == ["REJECTED"]


async def test_reject_timeout_fails_the_queued_request():
    ex = HeldExecutor("a")
    db = {"default_queue_policy": {"default_timeout_microseconds": 60_000_000, "allow_timeout_override": True}}
    batcher, stats = make([ex], max_batch_size=1, db=db)
    batcher.submit(request("run"))
    await until(lambda: ex.batches, "the first batch")
    expiring = batcher.submit(request("short", timeout_us=20_000))
    kept = batcher.submit(request("long"))
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(expiring, WAIT_S)
    assert info.value.code == ErrorCode.UNAVAILABLE and info.value.message == "Request timeout expired"
    assert stats.failures == ["REJECTED"] and batcher.pending_count == 1 and not kept.done()


async def test_delay_timeout_moves_the_request_behind_the_others():
    ex = HeldExecutor("a")
    db = {"default_queue_policy": {"default_timeout_microseconds": 60_000_000, "allow_timeout_override": True,
                                   "timeout_action": "DELAY"}}
    batcher, _ = make([ex], max_batch_size=1, db=db)
    futures = [batcher.submit(request("run"))]
    await until(lambda: ex.batches, "the first batch")
    futures.append(batcher.submit(request("short", timeout_us=1_000)))
    futures.append(batcher.submit(request("long")))
    await until(lambda: [p.request.id for p in batcher.queue] == ["long", "short"], "the delayed request to move")
    for i in range(3):
        await release_when_sent(ex, i)
    await asyncio.gather(*futures)
    assert ex.batches == [["run"], ["long"], ["short"]]


async def test_priority_levels_reorder_a_backlog():
    ex = HeldExecutor("a")
    batcher, _ = make([ex], max_batch_size=1, db={"priority_levels": 2, "default_priority_level": 2})
    futures = [batcher.submit(request("block"))]
    await until(lambda: ex.batches, "the first batch")
    futures += [batcher.submit(request("low%d" % i)) for i in range(2)]
    futures += [batcher.submit(request("high%d" % i, priority=1)) for i in range(2)]
    for i in range(5):
        await release_when_sent(ex, i)
    await asyncio.gather(*futures)
    assert [b[0] for b in ex.batches] == ["block", "high0", "high1", "low0", "low1"]


async def test_queue_delay_sends_a_lone_request_after_the_delay():
    ex = HeldExecutor("a")
    batcher, _ = make([ex], db={"max_queue_delay_microseconds": 50_000})
    loop = asyncio.get_running_loop()
    start = loop.time()
    future = batcher.submit(request("alone"))
    await until(lambda: ex.batches, "the delayed batch")
    assert loop.time() - start >= 0.045
    ex.release()
    await future


async def test_no_ready_instance_fails_queued_requests():
    ex = HeldExecutor("a")
    batcher, _ = make([ex], max_batch_size=1)
    batcher.submit(request("run"))
    await until(lambda: ex.batches, "the first batch")
    queued = batcher.submit(request("queued"))
    ex.ready = False
    batcher.instance_changed(ex)
    with pytest.raises(InferdError) as info:
        await queued
    assert info.value.code == ErrorCode.UNAVAILABLE
    with pytest.raises(InferdError):
        batcher.submit(request("late"))
    ex.ready = True
    ex.release()
    await batcher.close()


class MixedAnswers(HeldExecutor):
    """Answers request "bad" with an error, every other one with a response."""

    async def execute(self, requests: list[InferRequest]) -> Any:
        result = await super().execute(requests)
        result.responses = [InferdError(ErrorCode.INTERNAL, "model failed") if r.id == "bad" else resp
                            for r, resp in zip(requests, result.responses)]
        return result


async def test_a_batch_with_an_error_and_a_cancelled_request_counts_each_and_answers_the_rest():
    ex = MixedAnswers("a")
    batcher, stats = make([ex])
    ok, gone, bad = (batcher.submit(request(rid)) for rid in ("ok", "gone", "bad"))
    await until(lambda: ex.batches, "the batch")
    gone.cancel()  # while it runs: its answer is dropped, its batch item still ran
    ex.release()
    assert (await asyncio.wait_for(ok, WAIT_S)).id == "ok"
    with pytest.raises(InferdError, match="model failed"):
        await asyncio.wait_for(bad, WAIT_S)
    assert gone.cancelled() and ex.cancelled == ["gone"]
    assert stats.executions == [2] and stats.successes == 1 and stats.failures == ["CANCELED", "BACKEND"]
    await until(lambda: batcher.running == 0, "the batch to finish")


class FreesEarly(HeldExecutor):
    """Calls the scheduler's on_free as each answer 'arrives', before the batch's future resolves (as
    instances.worker.WorkerProcess does)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.frees: list[Any] = []

    def launch(self, requests: list[InferRequest], on_free: Any = None) -> asyncio.Future[Any]:
        self.frees.append(on_free)
        return asyncio.ensure_future(self.execute(requests))

    def answer_arrives(self, index: int) -> None:
        self.frees[index]()
        self.release(index)


async def test_an_instance_freed_as_its_answer_arrives_gets_the_next_batch_before_the_answers_are_out():
    ex = FreesEarly("a")
    batcher, stats = make([ex], max_batch_size=2)
    first = [batcher.submit(request(f"a{i}")) for i in range(2)]
    await until(lambda: ex.batches, "the first batch")
    second = [batcher.submit(request(f"b{i}")) for i in range(2)]
    await asyncio.sleep(0)
    assert ex.batches == [["a0", "a1"]]  # busy, depth 1: the second batch waits
    assert len(ex.frees) == 1
    ex.answer_arrives(0)
    assert len(ex.frees) == 2 and batcher.running == 4  # the second batch left at once, synchronously
    assert not any(f.done() for f in first)
    await until(lambda: len(ex.batches) == 2, "the second batch")
    assert ex.batches[1] == ["b0", "b1"]
    assert [f.id for f in await asyncio.gather(*first)] == ["a0", "a1"]
    ex.frees[0]()  # a second call changes nothing
    ex.answer_arrives(1)
    assert [f.id for f in await asyncio.gather(*second)] == ["b0", "b1"]
    assert stats.executions == [2, 2] and stats.successes == 4
    assert batcher._held[id(ex)] == 0 and batcher.running == 0


async def warm_up(batcher: DynamicBatcher, ex: FreesEarly, run_s: float, answer_s: float = 0.0) -> None:
    """One batch that runs `run_s` and whose answering takes `answer_s`: what `_refill` goes by."""
    warm = batcher.submit(request("warm"))
    await until(lambda: ex.batches, "the warm-up batch")
    if answer_s:
        def slow_answer(fut: Any) -> None:
            time.sleep(answer_s)
        warm.add_done_callback(slow_answer)
        warm.eager = slow_answer  # run within the batch's answering, as the HTTP connection's is
    await asyncio.sleep(run_s)
    ex.answer_arrives(len(ex.batches) - 1)
    await warm
    await until(lambda: batcher.running == 0, "the warm-up batch to finish")


async def test_a_freed_instance_with_a_partial_queue_first_reads_what_arrives_in_the_next_pass():
    # batches that run long next to answering them (a fixed-cost model): the clients answered by a batch
    # send their next requests at once, and forming waits for the loop's next read, so they join the
    # requests already queued instead of splitting off into a cohort of their own
    ex = FreesEarly("a")
    batcher, _ = make([ex], max_batch_size=4)
    await warm_up(batcher, ex, run_s=0.1)
    first = [batcher.submit(request(f"a{i}")) for i in range(2)]
    await until(lambda: len(ex.batches) == 2, "the first batch")
    queued = batcher.submit(request("b0"))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    ex.answer_arrives(1)
    assert batcher.running == 2  # b0 alone does not leave at once
    late = []
    loop.call_soon(lambda: late.append(batcher.submit(request("c0"))))  # read on the next pass
    await until(lambda: len(ex.batches) == 3, "the second batch")
    assert ex.batches[2] == ["b0", "c0"]
    await asyncio.gather(*first)
    ex.answer_arrives(2)
    await asyncio.gather(queued, *late)


async def test_a_fast_model_s_queued_requests_leave_at_once_when_its_instance_frees():
    # batches that run briefly next to answering them: keeping the instance busy is worth more
    ex = FreesEarly("a")
    batcher, _ = make([ex], max_batch_size=4)
    await warm_up(batcher, ex, run_s=0.0, answer_s=0.05)
    first = [batcher.submit(request(f"a{i}")) for i in range(2)]
    await until(lambda: len(ex.batches) == 2, "the first batch")
    queued = batcher.submit(request("b0"))
    await asyncio.sleep(0)
    ex.answer_arrives(1)
    assert batcher.running == 3  # b0 left at once, synchronously
    await until(lambda: len(ex.batches) == 3, "the second batch")
    assert ex.batches[2] == ["b0"]
    await asyncio.gather(*first)
    ex.answer_arrives(2)
    await queued


class EagerAnswers(HeldExecutor):
    """Answers as instances.pipeline does: the batch's future offers `eager`, a done-callback that
    `answer` runs within the call instead of the loop's next pass."""

    def launch(self, requests: list[InferRequest], on_free: Any = None) -> asyncio.Future[Any]:
        from inferd.supervisor.instances.pipeline import BatchFuture
        self.batches.append([r.id for r in requests])
        fut = BatchFuture(loop=asyncio.get_running_loop())
        fut.eager = None
        self._gates.append(fut)
        return fut

    def answer(self, index: int) -> None:
        fut = self._gates[index]
        eager = fut.eager
        assert eager is not None, "the dynamic batcher asks for its answer within the read"
        fut.eager = None
        fut.remove_done_callback(eager)
        fut.set_result(Result([InferResponse("m", "1", id=rid) for rid in self.batches[index]]))
        eager(fut)


async def test_an_eager_answer_reaches_each_request_callback_within_the_read_after_the_figures():
    ex = EagerAnswers("a")
    batcher, stats = make([ex])
    futures = [batcher.submit(request(str(i))) for i in range(3)]
    await until(lambda: ex.batches, "a batch")
    seen: list[tuple[str, int]] = []
    for f in futures[:2]:  # as the HTTP connection does: a done-callback, also offered as `eager`
        def done(fut: Any) -> None:
            seen.append((fut.result().id, stats.successes))
        f.add_done_callback(done)
        f.eager = done
    late: list[str] = []
    futures[2].add_done_callback(lambda fut: late.append(fut.result().id))  # an ordinary callback
    ex.answer(0)
    assert seen == [("0", 3), ("1", 3)]  # within the call, once each, after the batch was counted
    assert late == []  # the loop runs the others
    await asyncio.sleep(0)
    assert late == ["2"] and len(seen) == 2
    assert [f.id for f in await asyncio.gather(*futures)] == ["0", "1", "2"]
    assert all(f.eager is None for f in futures)
