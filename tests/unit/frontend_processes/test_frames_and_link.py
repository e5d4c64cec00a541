"""The frontend link's frames (frontend_processes/frames.py) over a real Unix socket pair
(frontend_processes/link.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from inferd.supervisor.flags import default_frontend_processes, parse_args
from inferd.supervisor.frontend_processes import frames
from inferd.supervisor.frontend_processes.frames import Kind
from inferd.supervisor.frontend_processes.link import Link
from inferd.supervisor.frontend_processes.snapshot import View
from inferd.supervisor.inference.types import InferRequest, InferResponse, RequestedOutput, Tensor
from inferd.worker.wire.errors import ErrorCode, InferdError


def test_default_frontend_processes_follows_the_cpus():
    assert [default_frontend_processes(n) for n in (1, 2, 4, 7)] == [1, 1, 1, 1]
    assert [default_frontend_processes(n) for n in (8, 16, 32, 64, 128)] == [2, 4, 8, 8, 8]


def test_frontend_processes_flag(tmp_path):
    cfg = parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path), "--frontend-processes", "3"])
    assert cfg.frontend_processes == 3
    assert cfg.argv[-2:] == ("--frontend-processes", "3")  # what the frontend processes parse again
    with pytest.raises(SystemExit, match="--frontend-processes must be between 1 and 64"):
        parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path), "--frontend-processes", "0"])


def test_request_round_trip_keeps_every_field_and_refers_to_regions():
    req = InferRequest("m", "2", "id7", [Tensor("A", "FP32", [2], b"\x00" * 8, {"p": 1}),
                                        Tensor("B", "UINT8", [3], b"abc"),
                                        Tensor("C", "UINT8", [100000], b"", shm_ref=("inferd_1_0.5.6", 0))],
                       [RequestedOutput("Y", {"binary_data": True})], {"k": "v"}, "seq", 1, 3, 500)
    req.inputs[2].data = memoryview(bytearray(100000))
    req.trace_parent = "00-abc"
    header, chunks, size = frames.request_parts(req)
    assert size == 11 and b"".join(bytes(c) for c in chunks) == b"\x00" * 8 + b"abc"  # the big one not copied
    seen = []

    def attach(name: str, offset: int, nbytes: int) -> memoryview:
        seen.append((name, offset, nbytes))
        return memoryview(bytearray(nbytes))

    back = frames.decode_request(header, memoryview(b"".join(bytes(c) for c in chunks)), attach)
    assert seen == [("inferd_1_0.5.6", 0, 100000)]
    assert (back.model_name, back.model_version, back.id, back.correlation_id, back.flags, back.priority,
            back.timeout_us, back.parameters, back.trace_parent) == ("m", "2", "id7", "seq", 1, 3, 500, {"k": "v"},
                                                                     "00-abc")
    assert back.arrival_ns == req.arrival_ns  # CLOCK_MONOTONIC is one clock for every process
    assert [(t.name, t.shape, bytes(t.data)[:3], t.parameters) for t in back.inputs[:2]] == [
        ("A", [2], b"\x00" * 3, {"p": 1}), ("B", [3], b"abc", {})]
    assert back.inputs[2].shm_ref == ("inferd_1_0.5.6", 0)
    assert back.outputs[0].name == "Y" and back.outputs[0].parameters == {"binary_data": True}


def test_snapshot_view_answers_as_the_core_would():
    view = View({"version": 3, "live": True, "ready": True, "server": {}, "shm": [], "models": {
        "m": {"": {"meta": {"ok": {"name": "m"}}, "config": {"ok": {}}, "decoupled": {"ok": False}, "ready": True},
              "1": {"meta": {"err": [4, "not ready"]}, "config": {"ok": {}}, "decoupled": {"ok": False},
                    "ready": False}}}})
    assert view.value("meta", "m", "") == {"name": "m"}
    with pytest.raises(InferdError) as err:
        view.value("meta", "m", "1")
    assert err.value.code == ErrorCode.UNAVAILABLE
    with pytest.raises(InferdError, match="Request for unknown model: 'x' is not found"):
        view.value("config", "x", "")
    with pytest.raises(InferdError, match="'m' version 9 is not found"):
        view.value("config", "m", "9")
    assert view.model_ready("m", "") and not view.model_ready("m", "1") and not view.model_ready("x", "")


async def test_link_carries_frames_in_order_and_reports_loss():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loop = asyncio.get_running_loop()
    got: list[tuple[int, int, bytes, bytes]] = []
    lost = asyncio.Event()
    enough = asyncio.Event()

    def on_frame(kind: int, call: int, header: memoryview, data: memoryview) -> None:
        got.append((kind, call, bytes(header), bytes(data)))
        if len(got) == 200:
            enough.set()

    _, sender = await loop.create_unix_connection(lambda: Link(lambda *x: None, lambda e: None, 1 << 20), sock=a)
    _, receiver = await loop.create_unix_connection(lambda: Link(on_frame, lambda e: lost.set(), 1 << 20), sock=b)
    resp = InferResponse("m", "1", "r", [Tensor("Y", "BYTES", [1], b"\x01\x00\x00\x00z" * 3000)])
    for i in range(200):
        head, chunks, size = frames.response_parts(resp)
        assert sender.send(Kind.RESULT, i, frames.dumps(head), chunks, size)
    await asyncio.wait_for(enough.wait(), 10)
    assert [c for _, c, _, _ in got] == list(range(200))
    back = frames.decode_response(frames.loads(got[-1][2]), memoryview(got[-1][3]))
    assert bytes(back.outputs[0].data) == b"\x01\x00\x00\x00z" * 3000
    sender.send(Kind.RESULT, 1, b"x" * (2 << 20))  # beyond the receiver's frame limit: it closes the link
    await asyncio.wait_for(lost.wait(), 10)
    assert receiver.closed
    sender.close()


def test_the_default_stays_one_process_where_cuda_shared_memory_is_served(tmp_path):
    from dataclasses import replace

    from inferd.supervisor.app import App

    cfg = replace(parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path)]),
                  frontend_processes=4)  # as the default on 16 CPUs
    assert not cfg.frontend_processes_given
    assert App(cfg)._frontend_count(cuda_shm=True) == 1
    assert App(cfg)._frontend_count(cuda_shm=False) == 4
    given = replace(cfg, frontend_processes_given=True)  # the flag: CUDA shared memory is then refused
    assert App(given)._frontend_count(cuda_shm=True) == 4


def test_bytes_ride_the_link_as_base64():
    doc = {"op": 4, "args": ["m", {"config": "{}", "file:1/model.py": b"\x00\xffcode"}]}
    assert frames.loads_revived(frames.dumps(doc)) == doc


async def test_a_request_too_large_for_the_link_is_refused_not_sent():
    from inferd.supervisor.frontend_processes.remote_dataplane import RemoteDataPlane

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loop = asyncio.get_running_loop()
    got: list[int] = []
    _, core = await loop.create_unix_connection(lambda: Link(lambda k, c, h, d: got.append(k), lambda e: None,
                                                             1 << 20), sock=b)
    dp = RemoteDataPlane()
    _, dp.link = await loop.create_unix_connection(lambda: Link(dp._on_frame, dp._on_lost, 4096), sock=a)
    with pytest.raises(InferdError, match="request too large"):
        await dp.load_model("m", {"config": "{}", "file:1/model.py": b"x" * 8192})
    assert not dp._calls and not dp.lost.is_set()
    dp.link.close()
    core.close()
    dp.pool.close()
