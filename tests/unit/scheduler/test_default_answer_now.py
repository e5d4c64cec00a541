"""The default scheduler on the real BatchPipeline: a worker's answer is handed on within the call that
reads it (the batch's completion, then the request's eager done-callback), each exactly once, and the
scheduler's and the pipeline's counts come back to zero; errors and cancels keep the loop's callbacks."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.instances import results
from inferd.supervisor.instances.packing import InputPacker
from inferd.supervisor.instances.pipeline import BatchPipeline
from inferd.supervisor.scheduler.default import DefaultScheduler
from inferd.worker.wire import writers
from inferd.worker.wire.errors import ErrorCode, InferdError

from .fakes import Stats

RAW = struct.pack("<4f", 1, 2, 3, 4)


class PipelineExecutor:
    """The instance as the scheduler sees it: the real pipeline's launch, always ready."""

    name = "m_0"
    ready = True

    def __init__(self, pipeline: BatchPipeline) -> None:
        self.launch = pipeline.launch

    def cancel(self, requests: Any) -> None:
        pass


def answer(batch_id: int) -> tuple[Any, Any]:
    """A worker's ExecuteResult for Execute `batch_id` (one request, id = batch_id), as read."""
    refs = [writers.output_ref_json("Y", "FP32", (4,), 0, 0, 16)]
    header = writers.execute_result_header(batch_id, [writers.response_item_json(batch_id, refs)], 1, 2, 3)
    return results.read([memoryview(header), memoryview(RAW)])


def setup() -> tuple[DefaultScheduler, BatchPipeline, list[Any], Stats]:
    sent: list[Any] = []
    pipeline = BatchPipeline(depth=2, packer=InputPacker(None), outputs=None, model_version="1",
                             send=lambda frames, hold: sent.append(frames), send_quiet=lambda msg: None,
                             kill=lambda reason: None, refusal=lambda: None, who=lambda: "worker")
    stats = Stats()
    scheduler = DefaultScheduler("m", [PipelineExecutor(pipeline)], stats, max_queue_size=0,  # type: ignore[list-item]
                                 runners_per_instance=2)
    scheduler.start()
    return scheduler, pipeline, sent, stats


def request(rid: str) -> InferRequest:
    return InferRequest("m", id=rid, inputs=[Tensor("X", "FP32", [4], RAW)])


async def test_an_answer_runs_the_requests_eager_callback_once_within_the_read():
    scheduler, pipeline, sent, stats = setup()
    calls: list[Any] = []

    def done(fut: Any) -> None:
        calls.append(fut.result())

    for k in (1, 2, 3):
        item = scheduler.submit(request(str(k)))
        item.add_done_callback(done)
        item.eager = done
        assert len(sent) == k
        pipeline.on_result(*answer(k))
        assert len(calls) == k  # within on_result: no loop pass in between
        assert calls[-1].outputs[0].name == "Y"
        assert scheduler._held == {id(scheduler.executors[0]): 0} and not scheduler._running
        assert pipeline._slots == 0 and not pipeline._batches
    for _ in range(5):
        await asyncio.sleep(0)  # nothing left for the loop: each callback ran once
    assert len(calls) == 3
    assert stats.successes == 3 and stats.failures == []
    assert scheduler._idle.is_set()
    await scheduler.close()


async def test_without_eager_the_callback_runs_on_a_later_pass_once():
    scheduler, pipeline, sent, stats = setup()
    calls: list[Any] = []
    item = scheduler.submit(request("1"))
    item.add_done_callback(calls.append)
    pipeline.on_result(*answer(1))
    assert item.done() and calls == []  # the scheduler answered it at once; the loop runs the callback
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == [item]
    assert scheduler._held == {id(scheduler.executors[0]): 0}
    await scheduler.close()


async def test_a_cancelled_request_still_frees_its_instance_once():
    scheduler, pipeline, sent, stats = setup()
    calls: list[Any] = []
    item = scheduler.submit(request("1"))
    item.add_done_callback(calls.append)
    item.eager = calls.append
    item.cancel()
    pipeline.on_result(*answer(1))
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == [item]  # the cancel ran it, through the loop, once
    assert scheduler._held == {id(scheduler.executors[0]): 0} and pipeline._slots == 0
    assert stats.failures == ["CANCELED"]
    await scheduler.close()


async def test_a_batch_the_link_cannot_send_fails_naming_the_instance():
    """A worker whose socket closed a moment before its instance learnt of it: the request's error names the
    model's instance (the link's own words name only the socket)."""
    def unreachable(frames: Any, hold: bool) -> None:
        raise InferdError(ErrorCode.UNAVAILABLE, "worker 'w2' is not connected")

    pipeline = BatchPipeline(depth=2, packer=InputPacker(None), outputs=None, model_version="1",  # type: ignore[arg-type]
                             send=unreachable, send_quiet=lambda msg: None, kill=lambda reason: None,
                             refusal=lambda: None, who=lambda: "model 'm' instance 'm_0'")
    for k in range(3):  # (more than the depth: each failed send gave its slot back)
        with pytest.raises(InferdError) as caught:
            pipeline.launch([request(str(k))])
        assert caught.value.code == ErrorCode.UNAVAILABLE
        assert caught.value.message == "model 'm' instance 'm_0': worker 'w2' is not connected"
