"""A real worker process serving a direct peer (wire message Attach, docs/worker-protocol.md "Direct peers").

The core is a supervisor.instances.channel.Channel at `workers.sock`, the frontend a second one at
`fe-1.sock`; the worker is started as the supervisor starts it (bootstrap line on stdin, the staging
PYTHONPATH of the protocol doc). Waits are on messages, connection events and the worker's log lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from inferd.supervisor.instances.channel import Channel
from inferd.worker import direct_serving, merged_serving
from inferd.worker.direct_peers import SEND_TIMEOUT_S
from inferd.worker.wire import messages as m
from inferd.worker.wire import zmtp
from inferd.worker.wire.errors import ErrorCode
from integration.worker.workerharness import make_pypath, worker_env

WAIT_S = 30.0
IDENT = "w_0"

MODEL = """
import json
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            params = json.loads(request.parameters())
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if params.get("count"):  # how many requests this execute() got
                x = np.array([len(requests) - 1], np.float32)
            if params.get("block"):  # until cancelled or `block` seconds: OUT [1] if it was cancelled
                print("model: blocking", file=sys.stderr, flush=True)
                deadline = time.monotonic() + params["block"]
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.002)
                y = np.array([1.0 if request.is_cancelled() else 0.0], np.float32)
            else:
                y = x + 1
            if params.get("big"):  # 400 kB: an output region of the worker
                y = np.full(100_000, y[0], np.float32)
            elif params.get("n"):  # n floats (below 256 KiB: inline, in the reply's frames)
                y = np.full(params["n"], y[0], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y)]))
        return out
"""

DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def config(name: str, decoupled: bool = False, batching: bool = False) -> dict:
    doc: dict[str, Any] = {
        "name": name, "max_batch_size": 0, "backend": "python",
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    if decoupled:
        doc["model_transaction_policy"] = {"decoupled": True}
    if batching:  # (a ragged input: any requests may share a batch, so the worker merges them)
        doc.update(max_batch_size=8, dynamic_batching={})
        doc["input"][0]["allow_ragged_batch"] = True
    return doc


class Side:
    """One ROUTER (a Channel) and the messages the worker's socket of identity IDENT sent it."""

    def __init__(self, run_dir: str, name: str) -> None:
        self.channel = Channel(run_dir, name)
        self.queue: asyncio.Queue[tuple[Any, list[bytes]]] = asyncio.Queue()
        self.ready = asyncio.Event()
        self.lost = asyncio.Event()
        self.readies = 0

    def open(self) -> Side:
        self.channel.open()

        def on_ready(_identity: str) -> None:
            self.readies += 1
            self.lost.clear()
            self.ready.set()

        def on_lost(_identity: str) -> None:
            self.ready.clear()
            self.lost.set()

        self.channel.register(IDENT, self._on_message, lambda frames: None, on_lost=on_lost, on_ready=on_ready)
        return self

    def _on_message(self, frames: list[Any]) -> None:
        message, data = m.decode([bytes(f) for f in frames])
        self.queue.put_nowait((message, [bytes(d) for d in data]))

    async def recv(self, cls: type = object) -> tuple[Any, list[bytes]]:
        message, data = await asyncio.wait_for(self.queue.get(), WAIT_S)
        assert isinstance(message, cls), "expected %s, got %r" % (cls.__name__, message)
        return message, data

    def send(self, message: Any, frames: list[bytes] | tuple = (), hold: bool = False) -> None:
        """`hold`: written with the other held messages of this loop pass, in one write."""
        self.channel.send(IDENT, m.encode(message, frames), hold)

    def execute(self, batch_id: int, rids: list[int], x: float = 1.0, hold: bool = False, **params: Any) -> None:
        data = np.array([x], np.float32).tobytes()
        items = [m.RequestItem(rid, "r%d" % rid, [m.TensorRef("IN", "FP32", [1], "frame", 0, "", 0, 4)], ["OUT"],
                               json.dumps(params)) for rid in rids]
        self.send(m.Execute(batch_id, items), [data], hold)


class Worker:
    """The worker process; its log lines are kept and can be waited for."""

    def __init__(self, run_dir: str, endpoint: str) -> None:
        pypath = make_pypath(Path(run_dir))
        self.proc = subprocess.Popen([sys.executable, "-s", "-m", "inferd.worker"], stdin=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=worker_env(pypath), cwd=run_dir)
        boot = {"wire_version": m.WIRE_VERSION, "endpoint": endpoint, "identity": IDENT, "instance_name": IDENT,
                "supervisor_pid": os.getpid(), "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 0.0}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(boot) + "\n").encode())
        self.proc.stdin.flush()
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            sys.stderr.write(line + "\n")
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    async def logged(self, text: str, start: int = 0) -> int:
        """Wait for a log line holding `text` (from line `start` on); its index."""
        def wait() -> int:
            with self._cond:
                for _ in range(int(WAIT_S * 10)):
                    for i in range(start, len(self.lines)):
                        if text in self.lines[i]:
                            return i
                    self._cond.wait(0.1)
            raise AssertionError("no log line with %r in %r" % (text, self.lines))
        return await asyncio.to_thread(wait)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def run_dir():
    path = tempfile.mkdtemp(prefix="inferd-dp")  # short: ipc paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def start(run_dir: str, tmp_path: Path, decoupled: bool = False, batching: bool = False) -> tuple[Side, Worker]:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(DECOUPLED if decoupled else MODEL))
    core = Side(run_dir, "workers.sock").open()
    worker = Worker(run_dir, core.channel.endpoint)
    await core.recv(m.Hello)
    doc = json.dumps(config("m", decoupled, batching))
    core.send(m.LoadModel("m", str(model_dir), "1", doc, "python", "m_0", "CPU"))
    loaded, _ = await core.recv(m.LoadResult)
    assert loaded.error is None
    return core, worker


async def attach(core: Side, run_dir: str, name: str = "fe-1.sock") -> Side:
    fe = Side(run_dir, name).open()
    core.send(m.Attach(fe.channel.endpoint))
    await asyncio.wait_for(fe.ready.wait(), WAIT_S)
    return fe


async def stop(core: Side, worker: Worker, *others: Side) -> None:
    try:
        core.send(m.Shutdown())
        await core.recv(m.Bye)
        assert await asyncio.to_thread(worker.proc.wait, WAIT_S) == 0
    finally:
        worker.kill()
        for side in (core, *others):
            side.channel.close()


def value(result: Any, frames: list[bytes], i: int = 0) -> np.ndarray:
    item = result.responses[i]
    assert item.error is None, item.error
    (ref,) = item.outputs
    return np.frombuffer(frames[ref.frame][ref.offset:ref.offset + ref.nbytes], np.float32)


async def round_trip(side: Side, batch_id: int, x: float = 1.0) -> None:
    side.execute(batch_id, [batch_id], x)
    result, frames = await side.recv(m.ExecuteResult)
    assert result.batch_id == batch_id and value(result, frames)[0] == x + 1


async def test_direct_execute_is_answered_on_the_direct_link_and_ids_may_collide(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = None
    try:
        fe = await attach(core, run_dir)
        fe.execute(1, [7], 10.0)
        result, frames = await fe.recv(m.ExecuteResult)
        assert result.batch_id == 1 and result.responses[0].request_id == 7 and value(result, frames)[0] == 11.0
        # the same batch and request ids from both senders at once: each answered on its own socket
        core.execute(1, [7], 100.0)
        fe.execute(1, [7], 200.0)
        (rc, fc), (rf, ff) = await core.recv(m.ExecuteResult), await fe.recv(m.ExecuteResult)
        assert value(rc, fc)[0] == 101.0 and value(rf, ff)[0] == 201.0
        await round_trip(core, 2)
        assert core.queue.empty() and fe.queue.empty()
    finally:
        await stop(core, worker, *([fe] if fe else []))


async def test_cancel_applies_to_the_sender_only(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        # the core cancels its own request 5: the peer's request 5 runs to its end
        fe.execute(1, [5], block=1.0)
        core.send(m.Cancel([5]))
        result, frames = await fe.recv(m.ExecuteResult)
        assert value(result, frames)[0] == 0.0
        # the peer cancels its request 6 while it runs, or before it starts
        fe.execute(2, [6], block=WAIT_S)
        fe.send(m.Cancel([6]))
        result, frames = await fe.recv(m.ExecuteResult)
        item = result.responses[0]
        assert (item.error is not None and item.error.code == ErrorCode.CANCELLED) or value(result, frames)[0] == 1.0
        # ... and the core's request 6 is not cancelled by it
        core.execute(3, [6], block=0.5)
        result, frames = await core.recv(m.ExecuteResult)
        assert value(result, frames)[0] == 0.0
    finally:
        await stop(core, worker, fe)


async def test_replies_to_a_run_of_waiting_executes_all_arrive_in_order(run_dir, tmp_path):
    """Executes that arrive together from two peers are answered in order, each on its socket, and the replies
    held for one write (the worker holds a fast model's replies while more messages wait: direct_serving.py) all
    leave once nothing waits. Each run ends with a Cancel, which is answered by nothing: only the flush once
    nothing waits sends the replies held before it (without it this test hangs)."""
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    fe2 = await attach(core, run_dir, "fe-2.sock")
    try:
        for burst in range(5):
            base = 100 * (burst + 1)
            for k in range(40):  # one write per peer: the worker reads each peer's together
                fe.execute(base + k, [base + k], float(k), hold=True)
                fe2.execute(base + k, [base + k], float(-k), hold=True)
            for side in (fe, fe2):
                side.send(m.Cancel([99_999]), hold=True)  # (no such request: nothing is answered)
            for k in range(40):
                result, frames = await fe.recv(m.ExecuteResult)
                assert result.batch_id == base + k and value(result, frames)[0] == k + 1
                result, frames = await fe2.recv(m.ExecuteResult)
                assert result.batch_id == base + k and value(result, frames)[0] == 1 - k
        assert fe.queue.empty() and fe2.queue.empty()
        await round_trip(core, 1)
    finally:
        await stop(core, worker, fe, fe2)


async def test_a_fast_reply_does_not_wait_for_a_long_execute_after_a_slow_one(run_dir, tmp_path):
    """A model that was just slow has its next replies written at once: a fast request's answer is not held
    while the request after it runs (here until cancelled)."""
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        for k in range(8):  # fast executes in a row: replies may be held from here on
            await round_trip(fe, 1 + k)
        fe.execute(20, [20], block=0.2, hold=True)  # slow: runs its 0.2 s
        fe.execute(21, [21], 5.0, hold=True)  # fast
        fe.execute(22, [22], block=WAIT_S * 4, hold=True)  # runs until cancelled
        first, _ = await fe.recv(m.ExecuteResult)
        fast, frames = await fe.recv(m.ExecuteResult)  # while 22 still runs
        assert first.batch_id == 20 and fast.batch_id == 21 and value(fast, frames)[0] == 6.0
        fe.send(m.Cancel([22]))
        last, frames = await fe.recv(m.ExecuteResult)
        assert last.batch_id == 22 and value(last, frames)[0] == 1.0
    finally:
        await stop(core, worker, fe)


async def test_output_regions_released_by_the_peer_and_reclaimed_when_it_goes(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        async def big(side: Side, batch_id: int) -> str:
            side.execute(batch_id, [batch_id], 3.0, big=True)
            result, _ = await side.recv(m.ExecuteResult)
            (ref,) = result.responses[0].outputs
            assert ref.loc == "shm" and ref.nbytes == 400_000
            return ref.region

        first = await big(fe, 1)
        second = await big(fe, 2)
        assert second != first  # the first is still the peer's
        fe.send(m.ReleaseOutputs([first]))
        assert await big(fe, 3) == first  # given back by the peer, taken again
        # the core cannot give back a region the peer holds (it never got it): a new one is made
        core.send(m.ReleaseOutputs([second]))
        third = await big(core, 4)
        assert third not in (first, second)
        core.send(m.ReleaseOutputs([third]))
        # the peer goes away holding two regions: both are taken back
        mark = len(worker.lines)
        fe.channel.close()
        await worker.logged("dropped", mark)
        got = {await big(core, 5), await big(core, 6), await big(core, 7)}
        assert got == {first, second, third}
    finally:
        await stop(core, worker, fe)


async def test_peer_gone_mid_request_worker_serves_on(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        fe.execute(1, [1], 2.0, block=0.5, big=True)  # answered after the peer has gone: its region comes back
        fe.execute(2, [2], 2.0)  # discarded with the peer
        mark = len(worker.lines)
        fe.channel.close()  # (its on_lost hook is not called: the channel closed itself)
        await worker.logged("dropped", mark)
        await round_trip(core, 3)
        core.execute(4, [4], 5.0, big=True)  # the region of the reply never sent is free again
        result, _ = await core.recv(m.ExecuteResult)
        assert result.responses[0].outputs[0].region.split(".")[0].endswith("_o0")
        assert worker.proc.poll() is None
    finally:
        await stop(core, worker, fe)


async def test_forbidden_or_malformed_message_drops_only_that_peer(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    fe2 = await attach(core, run_dir, "fe-2.sock")
    fe3 = Side(run_dir, "fe-3.sock").open()
    try:
        fe.send(m.Shutdown())  # a peer may not stop the worker
        await asyncio.wait_for(fe.lost.wait(), WAIT_S)
        await worker.logged("may not send Shutdown")
        await round_trip(core, 1)
        await round_trip(fe2, 2)
        fe2.send(m.ExecuteColumns(3, ["x"], []))  # malformed: request ids must be ints
        await asyncio.wait_for(fe2.lost.wait(), WAIT_S)
        await round_trip(core, 4)
        # an endpoint nobody listens at: logged, nothing else
        core.send(m.Attach("ipc://" + os.path.join(run_dir, "nobody.sock")))
        await worker.logged("cannot attach to direct peer")
        await round_trip(core, 5)
        # attached again (a fresh socket), then attached once more: the new connection replaces the old one
        core.send(m.Attach(fe3.channel.endpoint))
        await asyncio.wait_for(fe3.ready.wait(), WAIT_S)
        fe3.ready.clear()
        core.send(m.Attach(fe3.channel.endpoint))
        await asyncio.wait_for(fe3.ready.wait(), WAIT_S)
        await round_trip(fe3, 6)
        assert fe3.readies == 2 and not fe3.lost.is_set()  # a replaced connection is not a lost one
        await round_trip(core, 7)
    finally:
        await stop(core, worker, fe, fe2)
    await asyncio.wait_for(fe3.lost.wait(), WAIT_S)  # the worker's exit closes it
    fe3.channel.close()


async def test_decoupled_model_is_not_served_directly(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path, decoupled=True)
    fe = await attach(core, run_dir)
    try:
        fe.execute(1, [1, 2])
        result, _ = await fe.recv(m.ExecuteResult)
        assert [r.request_id for r in result.responses] == [1, 2]
        for item in result.responses:
            assert item.error is not None and "decoupled models are not served over a direct link" in item.error.message
        core.execute(2, [3], 4.0)  # the core's request streams as before
        response, frames = await core.recv(m.StreamResponse)
        assert response.final and response.response is not None
        (ref,) = response.response.outputs
        assert np.frombuffer(frames[ref.frame][ref.offset:ref.offset + ref.nbytes], np.float32)[0] == 5.0
        result, _ = await core.recv(m.ExecuteResult)
        assert result.batch_id == 2
        fe.execute(3, [4])  # still attached: refused again
        result, _ = await fe.recv(m.ExecuteResult)
        assert result.responses[0].error is not None
    finally:
        await stop(core, worker, fe)


async def test_peer_that_stops_reading_is_dropped(run_dir, tmp_path):
    """A peer that takes none of a reply for SEND_TIMEOUT_S is dropped; the worker then serves the core."""
    core, worker = await start(run_dir, tmp_path)
    path = os.path.join(run_dir, "deaf.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    conn = None
    try:
        core.send(m.Attach("ipc://" + path))
        conn, _ = await asyncio.to_thread(listener.accept)
        conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))
        await asyncio.to_thread(conn.recv, 4096)  # the worker's greeting and READY (not checked)
        # 40 replies of 240 kB in one batch: far more than the socket buffers hold, and never read
        data = np.array([1.0], np.float32).tobytes()
        items = [m.RequestItem(rid, "", [m.TensorRef("IN", "FP32", [1], "frame", 0, "", 0, 4)], ["OUT"],
                               json.dumps({"n": 60_000})) for rid in range(40)]
        whole, pieces = zmtp.encode(m.encode(m.Execute(1, items), [data]))
        conn.sendall(whole if not pieces else b"".join(bytes(p) for p in pieces))
        mark = len(worker.lines)
        core.execute(2, [2], 1.0)  # waits behind the stuck reply, then is answered
        await worker.logged("dropped", mark)
        result, frames = await asyncio.wait_for(core.recv(m.ExecuteResult), SEND_TIMEOUT_S + WAIT_S)
        assert value(result, frames)[0] == 2.0
        await round_trip(core, 3)
    finally:
        if conn is not None:
            conn.close()
        listener.close()
        await stop(core, worker)


async def test_at_most_max_peers_are_attached(run_dir):
    """DirectPeers in this process over real sockets: the 65th endpoint is refused with a log line."""
    from inferd.worker.channel import Channel as WorkerChannel
    from inferd.worker.direct_peers import MAX_PEERS, DirectPeers

    core = Side(run_dir, "workers.sock").open()
    sides = [Side(run_dir, "fe-%d.sock" % i).open() for i in range(MAX_PEERS + 1)]
    logged: list[str] = []
    main = await asyncio.to_thread(WorkerChannel, core.channel.endpoint, IDENT)
    peers = DirectPeers(main, logged.append, lambda regions: None)
    try:
        for side in sides:
            await asyncio.to_thread(peers.attach, side.channel.endpoint)
        assert len(peers) == MAX_PEERS
        assert "refused" in logged[-1] and sides[-1].channel.endpoint in logged[-1]
        await asyncio.wait_for(sides[MAX_PEERS - 1].ready.wait(), WAIT_S)
        assert not sides[-1].ready.is_set() and not sides[-1].channel.is_connected(IDENT)
        await asyncio.to_thread(peers.attach, sides[0].channel.endpoint)  # a known endpoint: replaced, not refused
        assert len(peers) == MAX_PEERS and "attached" in logged[-1]
    finally:
        peers.close()
        main.close()
        for side in (core, *sides):
            side.channel.close()


async def test_batches_queued_by_several_senders_run_as_one(run_dir, tmp_path):
    """A dynamic-batching model: the batches waiting for the worker (the core's and a peer's) run in one execute();
    each sender gets its own answer, and a peer's Cancel still reaches only its own request 1."""
    core, worker = await start(run_dir, tmp_path, batching=True)
    fe = await attach(core, run_dir)
    try:
        mark = len(worker.lines)
        core.execute(1, [100], block=1.0)  # keeps the worker busy while the next batches queue
        await worker.logged("model: blocking", mark)
        fe.execute(1, [1, 2], count=True)
        fe.send(m.Cancel([1]))
        core.execute(2, [1], count=True)
        result, frames = await core.recv(m.ExecuteResult)
        assert result.batch_id == 1 and value(result, frames)[0] == 0.0
        mine, mine_frames = await fe.recv(m.ExecuteResult)
        theirs, their_frames = await core.recv(m.ExecuteResult)
        assert mine.batch_id == 1 and theirs.batch_id == 2
        cancelled, ran = mine.responses
        assert cancelled.request_id == 1 and cancelled.error is not None and cancelled.error.code == ErrorCode.CANCELLED
        assert ran.request_id == 2 and value(mine, mine_frames, 1)[0] == 2.0  # one execute() of 2 requests
        assert theirs.responses[0].request_id == 1 and value(theirs, their_frames)[0] == 2.0
        # the execution is counted once (statistics): by the first reply, with its batch items in all
        assert result.merged == 0 and mine.merged == 2 and theirs.merged == -1
        await round_trip(fe, 3)
        await round_trip(core, 4)
    finally:
        await stop(core, worker, fe)


@pytest.mark.parametrize("inputs, merges", [
    ([{"name": "A", "dims": ["4"]}, {"name": "B", "dims": [2, 2]}], True),  # fixed dims (Triton's JSON: strings)
    ([{"name": "A", "dims": ["-1"], "allow_ragged_batch": True}], True),
    ([{"name": "A", "dims": ["-1"]}], False),  # shapes must match: one batcher decides
    ([{"name": "A", "dims": [2], "is_shape_tensor": True}], False),
    ([{"name": "A", "dims": [2], "optional": True}], False),
    ([{"name": "A", "dims": ["x"]}], False),
])
def test_only_models_whose_requests_may_all_share_a_batch_are_merged(inputs, merges):
    assert direct_serving.any_requests_batch({"input": inputs}) is merges


def test_a_merged_execute_waits_for_more_only_while_several_senders_alternate():
    """The gather window (merged_serving._executed): after an execute of 4 ms with batches from two senders,
    the next may wait 1 ms (a quarter) for more; a lone sender, or a short execute, never waits."""
    loop = merged_serving.MergedServing()
    loop._last_senders = frozenset()
    a, b = object(), object()
    loop._executed(4_000_000, [a, b])
    assert loop._gather_ns == 1_000_000
    loop._executed(4_000_000, [a])  # after a and b: the senders alternate
    assert loop._gather_ns == 1_000_000
    loop._executed(4_000_000, [a])  # a again and again: alone
    assert loop._gather_ns == 0
    loop._executed(40_000_000, [b])
    assert loop._gather_ns == merged_serving.GATHER_MAX_NS
    loop._executed(500_000, [a])  # short executes: keeping the worker busy is worth more
    assert loop._gather_ns == 0
