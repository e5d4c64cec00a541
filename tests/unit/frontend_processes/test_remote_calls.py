"""A frontend's calls to the core (frontend_processes/remote_dataplane.py) over a real Unix socket pair: every call is
answered exactly once, a call given up before its answer sends CANCEL, and one answered sends none."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from inferd.supervisor.frontend_processes import frames
from inferd.supervisor.frontend_processes.frames import Kind
from inferd.supervisor.frontend_processes.link import Link
from inferd.supervisor.frontend_processes.remote_dataplane import RemoteDataPlane
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.worker.wire.errors import InferdError


class Core:
    """The core's end of the link, recording the frames that reach it."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, bytes, bytes]] = []
        self.arrived = asyncio.Event()

    def on_frame(self, kind: int, call: int, header: memoryview, data: memoryview) -> None:
        self.frames.append((kind, call, bytes(header), bytes(data)))
        self.arrived.set()

    async def next(self, kind: int) -> tuple[int, int, bytes, bytes]:
        deadline = time.monotonic() + 10
        while True:
            for f in self.frames:
                if f[0] == kind:
                    self.frames.remove(f)
                    return f
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.01, deadline - time.monotonic()))


async def _pair() -> tuple[RemoteDataPlane, Core, Link]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loop = asyncio.get_running_loop()
    core = Core()
    _, core_link = await loop.create_unix_connection(lambda: Link(core.on_frame, lambda e: None, 1 << 20), sock=b)
    dp = RemoteDataPlane()
    dp._loop = loop
    _, dp.link = await loop.create_unix_connection(lambda: Link(dp._on_frame, dp._on_lost, 1 << 20), sock=a)
    return dp, core, core_link


def _request() -> InferRequest:
    return InferRequest("add_sub", "", "", [Tensor("INPUT0", "FP32", [2], b"\x00" * 8)])


async def test_an_answered_call_sends_no_cancel_and_a_given_up_one_does():
    dp, core, core_link = await _pair()
    try:
        answered = dp.infer_nowait(_request())
        _, call, header, data = await core.next(Kind.INFER)
        req = frames.decode_request(header, memoryview(data), None)
        assert (req.model_name, req.inputs[0].name, bytes(req.inputs[0].data)) == ("add_sub", "INPUT0", b"\x00" * 8)
        head, chunks, size = frames.response_parts(InferResponse("add_sub", "1", "", [Tensor("OUT", "FP32", [1],
                                                                                          b"\x01\x02\x03\x04")]))
        core_link.send(Kind.RESULT, call, frames.dumps(head), chunks, size)
        resp = await asyncio.wait_for(answered, 10)
        assert bytes(resp.outputs[0].data) == b"\x01\x02\x03\x04" and not dp._calls

        given_up = dp.infer_nowait(_request())
        _, call2, _, _ = await core.next(Kind.INFER)
        given_up.cancel()
        kind, cancelled, _, _ = await core.next(Kind.CANCEL)
        assert cancelled == call2
        core_link.send(Kind.ERROR, call2, frames.error_header(InferdError(1, "request cancelled")))
        deadline = time.monotonic() + 10
        while dp._calls and time.monotonic() < deadline:  # the core's one answer closes the call
            await asyncio.sleep(0.01)
        assert not dp._calls
        await asyncio.sleep(0.05)  # a stray CANCEL for the answered first call would have arrived by now
        assert all(f[0] != Kind.CANCEL for f in core.frames), core.frames
    finally:
        dp.link.close()
        core_link.close()
        dp.pool.close()


def test_the_plain_request_and_the_full_one_decode_alike():
    plain = InferRequest("m", "3", "", [Tensor("A", "INT32", [1], b"\x07\x00\x00\x00")], arrival_ns=12345)
    header, chunks, _ = frames.request_parts(plain)
    back = frames.decode_request(header, memoryview(b"".join(bytes(c) for c in chunks)), None)
    assert (back.model_name, back.model_version, back.id, back.outputs, back.parameters, back.correlation_id,
            back.flags, back.priority, back.timeout_us, back.arrival_ns) == ("m", "3", "", [], {}, 0, 0, 0, 0, 12345)
    assert bytes(back.inputs[0].data) == b"\x07\x00\x00\x00" and back.inputs[0].parameters == {}


@pytest.mark.parametrize("loc", [["b", 0, 99], ["b", -1, 2], ["b", 0.5, 1], ["x", 0, 1]])
def test_a_tensor_outside_its_frame_is_refused(loc):
    header = frames.dumps({"m": "m", "v": "", "a": 1, "in": [["A", "UINT8", [1], None, loc]]})
    with pytest.raises(InferdError):
        frames.decode_request(header, memoryview(b"\x00" * 4), None)
