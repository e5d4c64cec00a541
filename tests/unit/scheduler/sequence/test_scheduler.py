"""SequenceScheduler over in-process executors that hold each batch until the test releases it:
ordering within a sequence, slots and backlog, null requests, START/END rules, idle release,
cancellation and implicit state; plus the two strategies' batch selection on its own."""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from inferd.supervisor.inference.types import SEQUENCE_END, SEQUENCE_START, InferRequest, InferResponse, Tensor
from inferd.supervisor.scheduler.sequence.lanes import DirectPolicy, Lane, OldestPolicy, SeqItem, Sequence
from inferd.supervisor.scheduler.sequence.scheduler import SequenceScheduler
from inferd.worker.wire.errors import ErrorCode, InferdError

WAIT_S = 10.0
CONTROLS = {"control_input": [
    {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
    {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}]},
    {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
]}


@dataclass
class Result:
    responses: list[Any]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


def _int(t: Tensor) -> int:
    return struct.unpack("<q" if t.datatype in ("INT64", "UINT64") else "<i", bytes(t.data))[0]


class HeldExecutor:
    """Each batch waits for release(); answers OUT = INPUT + STATE_IN, and STATE_OUT = OUT when STATE_IN was given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = True
        self.batches: list[list[dict[str, int]]] = []  # per request: its inputs as ints
        self.cancelled: list[InferRequest] = []
        self._gates: list[asyncio.Future[None]] = []
        self.arrived = asyncio.Event()

    async def execute(self, requests: list[InferRequest]) -> Result:
        self.batches.append([{t.name: _int(t) for t in r.inputs} for r in requests])
        gate = asyncio.get_running_loop().create_future()
        self._gates.append(gate)
        self.arrived.set()
        await gate
        out = []
        for r in requests:
            values = {t.name: _int(t) for t in r.inputs}
            total = values.get("INPUT", 0) + values.get("STATE_IN", 0)
            data = struct.pack("<i", total)
            outputs = [Tensor("OUT", "INT32", [1, 1], data)]
            if "STATE_IN" in values:
                outputs.append(Tensor("STATE_OUT", "INT32", [1, 1], data))
            out.append(InferResponse("m", "1", outputs=outputs))
        return Result(out)

    async def wait_batches(self, n: int) -> None:
        async def until() -> None:
            while len(self.batches) < n:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.wait_for(until(), WAIT_S)

    def release_all(self) -> None:
        for gate in self._gates:
            if not gate.done():
                gate.set_result(None)

    def cancel(self, requests: Any) -> None:
        self.cancelled.extend(requests)


@dataclass
class Stats:
    executions: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    successes: int = 0

    def record_success(self, *args: Any) -> None:
        self.successes += 1

    def record_failure(self, reason: str, request_ns: int) -> None:
        self.failures.append(reason)

    def record_execution(self, batch_size: int, *args: Any) -> None:
        self.executions.append(batch_size)


def make(executors: list[HeldExecutor], mbs: int = 2, strategy: dict[str, Any] | None = None,
         idle_us: int = 60_000_000, state: bool = False, max_queue_size: int = 0) -> tuple[SequenceScheduler, Stats]:
    sb: dict[str, Any] = dict(CONTROLS, max_sequence_idle_microseconds=idle_us)
    sb.update(strategy or {"direct": {}})
    if state:
        sb["state"] = [{"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_INT32",
                        "dims": [1]}]
    config = {"name": "m", "max_batch_size": mbs, "sequence_batching": sb,
              "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]}
    stats = Stats()
    scheduler = SequenceScheduler("m", config, executors, stats, max_queue_size=max_queue_size)
    scheduler.start()
    return scheduler, stats


def req(corr: int | str, value: int, flags: int = 0) -> InferRequest:
    return InferRequest("m", inputs=[Tensor("INPUT", "INT32", [1, 1], struct.pack("<i", value))],
                        correlation_id=corr, flags=flags)


async def answer(future: asyncio.Future[InferResponse]) -> int:
    response = await asyncio.wait_for(future, WAIT_S)
    assert [t.name for t in response.outputs] == ["OUT"]
    return _int(response.outputs[0])


async def test_one_request_of_a_sequence_at_a_time_in_order() -> None:
    ex = HeldExecutor("i0")
    sched, stats = make([ex])
    first = sched.submit(req(1, 1, SEQUENCE_START))
    second = sched.submit(req(1, 2))
    other = sched.submit(req(2, 10, SEQUENCE_START))
    await ex.wait_batches(1)
    # the two sequences share a batch; the second request of sequence 1 waits for the first
    assert sorted(r["CORRID"] for r in ex.batches[0]) == [1, 2]
    ex.release_all()
    await answer(first)
    await answer(other)
    await ex.wait_batches(2)
    assert [r["CORRID"] for r in ex.batches[1] if r["READY"]] == [1] and ex.batches[1][0]["INPUT"] == 2
    ex.release_all()
    await answer(second)
    assert stats.executions == [2, 1] and stats.successes == 3
    await sched.close()


async def test_null_request_fills_a_lower_empty_slot() -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex], mbs=4)
    a = sched.submit(req(1, 1, SEQUENCE_START))
    b = sched.submit(req(2, 2, SEQUENCE_START))
    await ex.wait_batches(1)
    ex.release_all()
    await answer(a), await answer(b)
    only_b = sched.submit(req(2, 3))
    await ex.wait_batches(2)
    null, real = ex.batches[1]
    assert null == {"START": 0, "READY": 0, "CORRID": 0, "INPUT": 0}
    assert real == {"START": 0, "READY": 1, "CORRID": 2, "INPUT": 3}
    ex.release_all()
    assert await answer(only_b) == 3
    await sched.close()


async def test_backlog_waits_for_a_free_slot_and_end_releases_it() -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex], mbs=0)  # one slot
    a1 = sched.submit(req(1, 1, SEQUENCE_START))
    b1 = sched.submit(req(2, 5, SEQUENCE_START))  # backlogged
    await ex.wait_batches(1)
    ex.release_all()
    await answer(a1)
    a2 = sched.submit(req(1, 1, SEQUENCE_END))
    await ex.wait_batches(2)
    assert ex.batches[1][0]["CORRID"] == 1
    ex.release_all()
    await answer(a2)
    await ex.wait_batches(3)
    assert ex.batches[2][0]["CORRID"] == 2 and ex.batches[2][0]["START"] == 1
    ex.release_all()
    await answer(b1)
    await sched.close()


async def test_start_rules() -> None:
    ex = HeldExecutor("i0")
    sched, stats = make([ex])
    with pytest.raises(InferdError, match="must specify the START flag") as info:
        sched.submit(req(9, 1))
    assert info.value.code == ErrorCode.INVALID_ARG
    with pytest.raises(InferdError, match="non-zero or non-empty correlation ID"):
        sched.submit(req(0, 1, SEQUENCE_START))
    with pytest.raises(InferdError, match="batch-size 1"):
        sched.submit(InferRequest("m", inputs=[Tensor("INPUT", "INT32", [2, 1], bytes(8))], correlation_id=3,
                                  flags=SEQUENCE_START))
    with pytest.raises(InferdError, match="at most 128"):
        sched.submit(req("x" * 129, 1, SEQUENCE_START))
    done = sched.submit(req(9, 1, SEQUENCE_START | SEQUENCE_END))
    with pytest.raises(InferdError, match="must specify the START flag"):
        sched.submit(req(9, 1))  # END already queued
    await ex.wait_batches(1)
    ex.release_all()
    await answer(done)
    assert 9 not in sched.sequences and all(s is None for s in sched.lanes[0].slots)
    assert stats.failures == ["REJECTED"] * 5
    await sched.close()


async def test_negative_grpc_id_is_its_uint64_twin() -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex])
    first = sched.submit(req(-2, 1, SEQUENCE_START))
    await ex.wait_batches(1)
    assert ex.batches[0][0]["CORRID"] == -2  # (the test decodes UINT64 as signed)
    ex.release_all()
    await answer(first)
    second = sched.submit(req(2**64 - 2, 1, SEQUENCE_END))  # the same sequence
    await ex.wait_batches(2)
    ex.release_all()
    await answer(second)
    await sched.close()


async def test_restart_of_an_open_sequence_keeps_order_and_slot(caplog: pytest.LogCaptureFixture) -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex], state=True)
    first = sched.submit(req(4, 10, SEQUENCE_START))
    await ex.wait_batches(1)
    again = sched.submit(req(4, 1, SEQUENCE_START))
    assert "has a conflict" in caplog.text
    ex.release_all()
    assert await answer(first) == 10
    await ex.wait_batches(2)
    ex.release_all()
    assert await answer(again) == 1  # the new sequence starts from the initial state
    await sched.close()


async def test_implicit_state_is_carried_per_sequence() -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex], state=True, strategy={"oldest": {"max_candidate_sequences": 4}})
    sums = {1: 0, 2: 0}
    for step in range(3):
        futures = {}
        for corr in (1, 2):
            value = corr * 10 + step
            sums[corr] += value
            futures[corr] = sched.submit(req(corr, value, SEQUENCE_START if step == 0 else 0))
        await ex.wait_batches(step + 1)
        ex.release_all()
        for corr, future in futures.items():
            assert await answer(future) == sums[corr]
    await sched.close()


async def test_idle_sequence_is_released_with_a_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex], idle_us=50_000)
    first = sched.submit(req(5, 1, SEQUENCE_START))
    await ex.wait_batches(1)
    ex.release_all()
    await answer(first)

    async def released() -> None:
        while 5 in sched.sequences:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(released(), WAIT_S)
    assert "had no request for 50000 microseconds" in caplog.text
    with pytest.raises(InferdError, match="released after 50000 microseconds"):
        sched.submit(req(5, 1))
    await sched.close()


async def test_cancelling_a_queued_request_fails_the_rest_of_its_sequence() -> None:
    ex = HeldExecutor("i0")
    sched, stats = make([ex])
    running = sched.submit(req(7, 1, SEQUENCE_START))
    await ex.wait_batches(1)
    queued = sched.submit(req(7, 2))
    later = sched.submit(req(7, 3))
    queued.cancel()
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(later, WAIT_S)
    assert info.value.code == ErrorCode.CANCELLED
    ex.release_all()
    await answer(running)
    assert 7 not in sched.sequences and all(s is None for s in sched.lanes[0].slots)
    assert sched.pending_count == 0 and stats.failures == ["CANCELED", "CANCELED"]
    with pytest.raises(InferdError, match="START"):
        sched.submit(req(7, 4))
    await sched.close()


async def test_cancelling_a_running_request_reaches_its_worker() -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex])
    running = sched.submit(req(8, 1, SEQUENCE_START))
    await ex.wait_batches(1)
    running.cancel()

    async def told() -> None:
        while not ex.cancelled:
            await asyncio.sleep(0.001)
    await asyncio.wait_for(told(), WAIT_S)
    assert [r.correlation_id for r in ex.cancelled] == [8]
    ex.release_all()
    await sched.close()


async def test_sequences_spread_over_instances_and_stay_there() -> None:
    executors = [HeldExecutor("i0"), HeldExecutor("i1")]
    sched, _ = make(executors, mbs=0)
    futures = [sched.submit(req(c, 1, SEQUENCE_START)) for c in (1, 2)]
    for ex in executors:
        await ex.wait_batches(1)
        ex.release_all()
    for f in futures:
        await answer(f)
    owner = {ex.batches[0][0]["CORRID"]: ex for ex in executors}
    assert set(owner) == {1, 2}
    for _ in range(2):
        seen = {corr: len(ex.batches) for corr, ex in owner.items()}
        futures = [sched.submit(req(c, 1)) for c in (1, 2)]
        for corr, ex in owner.items():
            await ex.wait_batches(seen[corr] + 1)
            assert ex.batches[-1][0]["CORRID"] == corr
            ex.release_all()
        for f in futures:
            await answer(f)
    await sched.close()


async def test_queue_limit_and_close() -> None:
    ex = HeldExecutor("i0")
    sched, _ = make([ex], max_queue_size=1)
    running = sched.submit(req(1, 1, SEQUENCE_START))
    await ex.wait_batches(1)
    queued = sched.submit(req(1, 2))
    with pytest.raises(InferdError, match="Exceeds maximum queue size"):
        sched.submit(req(2, 1, SEQUENCE_START))
    ex.release_all()
    await answer(running)
    await sched.close()
    with pytest.raises(InferdError, match="unloaded") as info:  # it was running when the model closed
        await asyncio.wait_for(queued, WAIT_S)
    assert info.value.code == ErrorCode.UNAVAILABLE


# ---- batch selection alone ----

def _lane_with(n_slots: int, arrivals: dict[int, int]) -> Lane:
    lane = Lane(HeldExecutor("i0"), n_slots)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    for slot, arrival in arrivals.items():
        seq = Sequence(slot + 100)
        lane.slots[slot] = seq
        request = InferRequest("m", correlation_id=slot + 100, arrival_ns=arrival)
        seq.queue.append(SeqItem(request, loop.create_future(), seq))
    loop.close()
    return lane


def test_direct_fills_gaps_below_the_highest_ready_slot() -> None:
    lane = _lane_with(4, {1: 0, 3: 0})
    pick = DirectPolicy(4).pick(lane, 0)
    assert [None if i is None else i.request.correlation_id for i in pick.items] == [None, 101, None, 103]


def test_direct_waits_for_slot_utilization_within_the_delay() -> None:
    lane = _lane_with(4, {0: 0})
    policy = DirectPolicy(4, max_queue_delay_us=100_000, minimum_slot_utilization=0.5)
    assert policy.pick(lane, 50_000_000).items == [] and policy.pick(lane, 50_000_000).wait_s == pytest.approx(0.05)
    assert len(policy.pick(lane, 100_000_000).items) == 1


def test_oldest_takes_oldest_heads_and_honours_preferred_and_delay() -> None:
    now = time.monotonic_ns()
    lane = _lane_with(6, {0: now - 3, 1: now - 1, 2: now - 2})
    policy = OldestPolicy(2)
    assert [i.request.correlation_id for i in policy.pick(lane, now).items] == [100, 102]
    delayed = OldestPolicy(4, preferred_batch_sizes=[4], max_queue_delay_us=1_000_000)
    assert delayed.pick(lane, now).items == [] and delayed.pick(lane, now).wait_s > 0.9
    assert len(delayed.pick(lane, now + 2_000_000_000).items) == 3
    preferred = OldestPolicy(4, preferred_batch_sizes=[2], max_queue_delay_us=1_000_000)
    assert len(preferred.pick(lane, now).items) == 2
