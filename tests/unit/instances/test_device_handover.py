"""A device output's way through the supervisor without a GPU: a worker's result with a loc "cuda"
reference becomes a share in device_refs.TABLE, is handed to the next worker as the same reference,
goes back to the producer (ReleaseOutputs.device) once every holder dropped it, and fails the
consumer's result, naming the producer, if the producer died meanwhile."""

from __future__ import annotations

import asyncio
import gc

import pytest
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.instances import results
from inferd.supervisor.instances.outputs import WorkerOutputs
from inferd.supervisor.instances.packing import InputPacker
from inferd.supervisor.memory.device_refs import TABLE
from inferd.worker.wire import messages as m

HANDLE = "ab" * 64


def _result(rid: int, owner: str, offset: int = 256) -> m.ExecuteResult:
    ref = m.device_ref_json("Y", "FP32", [4], HANDLE, offset, 16, 0, owner)
    msg, _ = results.decode([m.execute_result_header(1, [m.response_item_json(rid, [ref])])])
    return msg


def test_device_output_handed_over_then_released() -> None:
    async def run() -> None:
        released: list[list[str]] = []
        producer = WorkerOutputs(lambda names: None, "w901", "gpu_a_0", released.append)
        req = InferRequest("a", device_outputs=True)
        result = results.batch_result([req], [7], _result(7, "gpu_a_0"), [], "1", producer)
        out = result.responses[0].outputs[0]
        assert out.device_ref is not None and out.data == b""
        assert TABLE.count("w901", HANDLE + ":256") == 1

        # the next step: the consumer's Execute carries the same reference
        consumer_req = InferRequest("b", inputs=[Tensor("X", "FP32", [4], out.data, device_ref=out.device_ref)])
        packed = InputPacker(None).pack([consumer_req])
        ref = packed.items[0]["inputs"][0]
        assert (ref["loc"], ref["region"], ref["offset"], ref["nbytes"], ref["owner"]) == (
            "cuda", HANDLE, 256, 16, "gpu_a_0")

        del result, out
        gc.collect()
        assert released == []  # the consumer's request still holds it
        del consumer_req, packed
        gc.collect()
        assert released == [[HANDLE + ":256"]]
        producer.close()

    asyncio.run(run())


def test_consumer_result_fails_when_the_producer_died() -> None:
    async def run() -> None:
        producer = WorkerOutputs(lambda names: None, "w902", "gpu_p_0", lambda keys: None)
        consumer = WorkerOutputs(lambda names: None, "w903", "gpu_c_0", lambda keys: None)
        out = results.batch_result([InferRequest("p")], [1], _result(1, "gpu_p_0"), [], "1", producer)
        given = out.responses[0].outputs[0]
        req = InferRequest("c", inputs=[Tensor("X", "FP32", [4], b"", device_ref=given.device_ref)])
        producer.close()  # kill -9 of the producer: its worker is reaped
        answer, _ = results.decode([m.execute_result_header(2, [m.response_item_json(5, [])])])
        result = results.batch_result([req], [5], answer, [], "1", consumer)
        error = result.responses[0]
        assert isinstance(error, Exception) and "gpu_p_0" in str(error) and "died" in str(error)
        with pytest.raises(Exception, match="gpu_p_0"):
            InputPacker(None).pack([req])  # and it is not handed to anyone else
        consumer.close()

    asyncio.run(run())


def test_worker_may_hand_back_only_device_memory_it_was_given() -> None:
    async def run() -> None:
        producer = WorkerOutputs(lambda names: None, "w904", "gpu_q_0", lambda keys: None)
        consumer = WorkerOutputs(lambda names: None, "w905", "ident_0", lambda keys: None)
        first = results.batch_result([InferRequest("q")], [1], _result(1, "gpu_q_0"), [], "1", producer)
        given = first.responses[0].outputs[0]
        req = InferRequest("ident", inputs=[Tensor("X", "FP32", [4], b"", device_ref=given.device_ref)])
        back = results.batch_result([req], [2], _result(2, "gpu_q_0"), [], "1", consumer)  # an identity model
        assert TABLE.count("w904", HANDLE + ":256") == 2  # the output's share, and the handed-back one
        assert back.responses[0].outputs[0].device_ref.share.label == "gpu_q_0"
        with pytest.raises(ValueError, match="not given"):
            results.batch_result([InferRequest("x")], [3], _result(3, "gpu_q_0", 512), [], "1", consumer)
        producer.close()
        consumer.close()

    asyncio.run(run())
