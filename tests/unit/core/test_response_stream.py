"""core.streaming.ResponseStream: ordering, finals, overflow, cancellation, scheduler failures."""

from __future__ import annotations

import asyncio

from inferd.supervisor.core.streaming import ResponseStream
from inferd.supervisor.inference.types import InferResponse
from inferd.worker.wire.errors import ErrorCode, InferdError


def resp(i: int) -> InferResponse:
    return InferResponse("m", "1", str(i))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_items_in_order_and_late_ones_dropped():
    async def main():
        s = ResponseStream()
        s.put(resp(0), False)
        s.put(resp(1), True)
        s.put(resp(2), False)  # after the final: dropped
        return [await s.get(), await s.get()], s

    got, s = run(main())
    assert [(r.id, f) for r, f in got] == [("0", False), ("1", True)]
    assert s.ended and s.responses == 2


def test_get_waits_for_the_producer():
    async def main():
        s = ResponseStream()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, s.put, resp(5), True)
        return await s.get()

    item, final = run(main())
    assert item.id == "5" and final


def test_overflow_ends_the_request_and_cancels_in_the_worker():
    cancels = []

    async def main():
        s = ResponseStream(limit=3)
        s.attach(lambda: cancels.append(1))
        for i in range(10):
            s.put(resp(i), False)
        return [await s.get() for _ in range(4)], s

    items, s = run(main())
    assert [r.id for r, _ in items[:3]] == ["0", "1", "2"]
    error, final = items[3]
    assert final and isinstance(error, InferdError) and error.code == ErrorCode.UNAVAILABLE
    assert cancels == [1] and s.ended


def test_cancel_drops_buffered_items_and_calls_the_canceller_once():
    cancels = []
    s = ResponseStream()
    s.put(resp(0), False)
    s.cancel()
    s.cancel()
    s.attach(lambda: cancels.append(1))  # attached after the consumer left: cancelled at once
    assert cancels == [1]
    s.put(resp(1), True)  # the worker's final still ends it
    assert s.ended
    ended = ResponseStream()
    ended.put(resp(0), True)
    ended.attach(lambda: cancels.append(2))
    ended.cancel()  # nothing to cancel after the final
    assert cancels == [1]


def test_a_failed_scheduler_future_ends_the_stream_unless_it_ended():
    async def main():
        loop = asyncio.get_running_loop()
        s = ResponseStream()
        fut = loop.create_future()
        s.watch(fut)
        fut.set_exception(InferdError(ErrorCode.UNAVAILABLE, "Request timeout expired"))
        item, final = await s.get()
        done = ResponseStream()
        done.put(resp(1), True)
        fut2 = loop.create_future()
        done.watch(fut2)
        fut2.set_exception(InferdError(ErrorCode.INTERNAL, "late"))
        await asyncio.sleep(0)
        ok = ResponseStream()
        fut3 = loop.create_future()
        ok.watch(fut3)
        fut3.set_result(object())
        fut4 = loop.create_future()
        ok.watch(fut4)
        fut4.cancel()
        await asyncio.sleep(0)
        return item, final, done.responses, ok.ended

    item, final, done_count, ok_ended = run(main())
    assert final and item.message == "Request timeout expired"
    assert done_count == 1 and not ok_ended
