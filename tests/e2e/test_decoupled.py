"""Decoupled models over gRPC streaming (tritonclient.grpc and grpc.aio): any number of responses per
request, flag-only finals, errors mid-stream, interleaved requests, refusal by unary endpoints,
cancellation when the stream closes, and a worker death mid-stream.

Fixture models: decoupled_repeat (IN=[n] -> n responses OUT=[i], behaviour switched by request
parameters) and decoupled_cancel (streams until cancelled, then writes a marker file).
Runs against the real Triton too (INFERD_E2E_TARGET=triton), except the inferd_only tests.
"""

from __future__ import annotations

import asyncio
import os
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

WAIT_S = 30.0  # bound on any single wait: generous for a busy machine, short enough to catch a hang
MODELS = ["decoupled_repeat", "decoupled_cancel"]


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


def repeat_input(n: int, mod=grpcclient):
    tensor = mod.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
    return tensor


class Stream:
    """A tritonclient.grpc stream whose callback results land in a queue, collected per request id."""

    def __init__(self, server):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.events: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def send(self, request_id: str, n: int, params: dict | None = None, empty_final: bool = True,
             model: str = "decoupled_repeat") -> None:
        self.client.async_stream_infer(model, [repeat_input(n)], request_id=request_id, parameters=params,
                                       enable_empty_final_response=empty_final)

    def next(self, timeout: float = WAIT_S):
        """(request id or None, OUT list or None, final, error text or None)."""
        result, error = self.events.get(timeout=timeout)
        if error is not None:
            return None, None, True, str(error)
        resp = result.get_response()
        out = result.as_numpy("OUT")
        final = resp.parameters["triton_final_response"].bool_param
        return resp.id, (out.tolist() if out is not None else None), final, None

    def collect(self, count: int, timeout: float = WAIT_S) -> list:
        deadline = time.monotonic() + timeout
        return [self.next(max(0.1, deadline - time.monotonic())) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server):
    s = Stream(server)
    yield s
    s.close()


@pytest.mark.parametrize("n", [1, 5])
def test_n_responses_then_flag_only_final(stream, n):
    stream.send("r", n)
    got = stream.collect(n + 1)
    assert got == [("r", [i], False, None) for i in range(n)] + [("r", None, True, None)]


def test_last_response_carries_final(stream):
    stream.send("r", 3, {"final_in_last": True})
    assert stream.collect(3) == [("r", [0], False, None), ("r", [1], False, None), ("r", [2], True, None)]


def test_responses_from_a_thread_after_execute_returned(stream):
    stream.send("t", 4, {"thread": True, "delay_ms": 20})
    assert stream.collect(5) == [("t", [i], False, None) for i in range(4)] + [("t", None, True, None)]


def test_zero_responses_with_empty_final(stream):
    stream.send("z", 0)
    assert stream.collect(1) == [("z", None, True, None)]


def test_zero_responses_without_empty_final_sends_nothing(stream):
    # one instance executes requests in order: once "after" is done, "z" has long ended, silently
    stream.send("z", 0, empty_final=False)
    stream.send("after", 1, {"final_in_last": True}, empty_final=False)
    assert stream.collect(1) == [("after", [0], True, None)]
    with pytest.raises(queue.Empty):
        stream.events.get(timeout=0.5)


def test_without_empty_final_the_data_responses_still_arrive(stream):
    stream.send("r", 2, empty_final=False)
    assert stream.collect(2) == [("r", [0], False, None), ("r", [1], False, None)]
    stream.send("after", 1, {"final_in_last": True}, empty_final=False)
    assert stream.collect(1) == [("after", [0], True, None)]


def test_error_response_mid_stream_keeps_the_request_going(stream):
    stream.send("e", 3, {"error_at": 1})
    got = stream.collect(4)
    assert got[0] == ("e", [0], False, None)
    assert got[1][3] == "error at 1"
    assert got[2:] == [("e", [2], False, None), ("e", None, True, None)]


def test_exception_in_execute_ends_the_request_with_its_error(stream):
    stream.send("x", 3, {"raise_after": 1})
    got = stream.collect(2)
    assert got[0] == ("x", [0], False, None)
    assert got[1][3].startswith("Failed to process the request(s) for model 'decoupled_repeat_0_0', "
                                "message: RuntimeError: raised after 1 responses")
    # the stream and the model still work
    stream.send("ok", 1, {"final_in_last": True})
    assert stream.collect(1) == [("ok", [0], True, None)]


def test_returning_responses_from_decoupled_execute_is_an_error(stream):
    stream.send("l", 2, {"return_list": True})
    (got,) = stream.collect(1)
    assert got[3] == ("Failed to process the request(s) for model 'decoupled_repeat_0_0', message: Python model "
                      "'decoupled_repeat_0_0' is using the decoupled mode and the execute function must return None.")


def test_concurrent_requests_interleave_on_one_stream(stream):
    counts = {"a": 3, "b": 5, "c": 1, "d": 4}
    for rid, n in counts.items():
        stream.send(rid, n, {"thread": True, "delay_ms": 15})
    got = stream.collect(sum(counts.values()) + len(counts))
    per_id: dict[str, list] = {rid: [] for rid in counts}
    for rid, out, final, err in got:
        assert err is None
        per_id[rid].append((out, final))
    for rid, n in counts.items():
        assert per_id[rid] == [([i], False) for i in range(n)] + [(None, True)], rid
    # they really were interleaved: some response of "a" came after the first one of "b"
    order = [rid for rid, *_ in got]
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")


def test_grpc_aio_stream_infer(server):
    # the aio client cannot ask for empty finals: the models mark their last data response final
    async def main():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            async def requests():
                for rid, n in (("p", 2), ("q", 3)):
                    yield {"model_name": "decoupled_repeat", "inputs": [repeat_input(n, grpcaio)],
                           "request_id": rid, "parameters": {"final_in_last": True, "thread": True}}

            seen: dict[str, list] = {"p": [], "q": []}
            async for result, error in client.stream_infer(requests(), stream_timeout=WAIT_S):
                assert error is None, error
                resp = result.get_response()
                final = resp.parameters["triton_final_response"].bool_param
                seen[resp.id].append((result.as_numpy("OUT").tolist(), final))
                if all(v and v[-1][1] for v in seen.values()):
                    break
            return seen
        finally:
            await client.close()

    seen = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert seen == {"p": [([0], False), ([1], True)], "q": [([0], False), ([1], False), ([2], True)]}


def test_unary_infer_of_a_decoupled_model_is_refused(server):
    http = server.http_client()
    try:
        with pytest.raises(InferenceServerException) as exc:
            http.infer("decoupled_repeat", [repeat_input(1, httpclient)])
        assert "doesn't support models with decoupled transaction policy" in str(exc.value)
    finally:
        http.close()
    status, body = server.post("/v2/models/decoupled_repeat/infer",
                               b'{"inputs":[{"name":"IN","shape":[1],"datatype":"INT32","data":[1]}]}')
    assert status == 501
    assert b"HTTP end point doesn't support models with decoupled transaction policy" in body
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as exc:
            grpc.infer("decoupled_repeat", [repeat_input(1)], client_timeout=WAIT_S)
        assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in exc.value.message()
    finally:
        grpc.close()


def _cancel_input(nbytes: int):
    tensor = grpcclient.InferInput("DATA", [nbytes], "UINT8")
    tensor.set_data_from_numpy(np.full(nbytes, 3, dtype=np.uint8))
    return tensor


def test_closing_the_stream_cancels_a_streaming_request(server, harness, tmp_path):
    """The model reads its (shared-memory) input while it streams, sees is_cancelled() once the client
    closes the stream, and the input lease returns to the pool (no new region per request)."""
    nbytes = 1 << 20  # > 64 KiB: travels through a supervisor shm region
    regions_before = None
    for i in range(3):
        marker = tmp_path / f"cancelled-{i}"
        client = grpcclient.InferenceServerClient(server.grpc_url)
        events: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, events=events: events.put((result, error)))
        client.async_stream_infer("decoupled_cancel", [_cancel_input(nbytes)], request_id=f"c{i}",
                                  parameters={"marker": str(marker)})
        result, error = events.get(timeout=WAIT_S)  # it is streaming
        assert error is None and result.as_numpy("SUM").tolist() == [3 * nbytes]
        client.stop_stream(cancel_requests=True)
        client.close()
        server.wait_until(marker.exists, WAIT_S, "the model to observe the cancellation")
        assert marker.read_text() == f"c{i}"
        if harness.target_is_triton():
            continue
        owned = {n for n in harness.shm_snapshot() if harness.shm_owner(n) == server.pid}
        if regions_before is None:
            regions_before = owned
        else:  # the lease came back: the same region serves the next request
            first = regions_before
            server.wait_until(lambda first=first: {n for n in harness.shm_snapshot()
                                                   if harness.shm_owner(n) == server.pid} <= first,
                              WAIT_S, "no new shm region per cancelled request")
    assert server.is_live() and server.model_ready("decoupled_cancel")


@pytest.mark.inferd_only
def test_statistics_count_streamed_requests(server):
    def success_count() -> int:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            stats = client.get_inference_statistics("decoupled_repeat")["model_stats"][0]
        finally:
            client.close()
        return int(stats["inference_stats"]["success"]["count"])

    before = success_count()
    s = Stream(server)
    try:
        s.send("s1", 2)
        s.send("s2", 0)
        s.collect(4)
    finally:
        s.close()
    server.wait_until(lambda: success_count() >= before + 2, WAIT_S, "2 more successes")


@pytest.mark.inferd_only
def test_worker_death_mid_stream_fails_the_open_request(server_factory):
    srv = server_factory(["decoupled_repeat"])
    s = Stream(srv)
    try:
        s.send("long", 1000, {"thread": True, "delay_ms": 20})
        first = s.next()
        assert first[:3] == ("long", [0], False)
        (pid,) = srv.worker_pids("decoupled_repeat")
        os.kill(pid, 9)
        deadline = time.monotonic() + WAIT_S
        while True:  # data responses already on their way may come first
            rid, out, final, err = s.next(max(0.1, deadline - time.monotonic()))
            if err is not None:
                break
            assert not final
        assert "decoupled_repeat" in err and "died" in err
        srv.wait_until(lambda: srv.model_ready("decoupled_repeat"), WAIT_S, "the restarted instance")
        s.send("after", 2)
        assert s.collect(3) == [("after", [0], False, None), ("after", [1], False, None), ("after", None, True, None)]
    finally:
        s.close()


def _until_inline(stream) -> list[int]:
    """Quick requests one at a time until one runs on the worker's main thread; what each reported. (A loaded
    host may slow a quick execute past INLINE_MAX_NS, which starts the count again: up to 20 counts' worth.)"""
    from inferd.worker.decoupled_serving import INLINE_AFTER

    seen: list[int] = []
    for _ in range(20 * (INLINE_AFTER + 1)):
        stream.send("q", 1, {"report_thread": True})
        (rid, out, final, error), (_, _, last, _) = stream.collect(2)
        assert error is None and not final and last, (rid, out, final, error)
        seen += out
        if out == [1]:
            break
    return seen


@pytest.mark.inferd_only
def test_a_quick_execute_moves_to_the_main_thread_and_a_slow_one_back(stream):
    """A decoupled execute that returns at once runs on the worker's main thread after INLINE_AFTER such
    executes in a row (no hand-off to the execute thread); one that takes INLINE_MAX_NS or more sends the
    next back to the execute thread. Responses are the same either way."""
    from inferd.worker.decoupled_serving import INLINE_AFTER, INLINE_MAX_NS

    attempts = []
    for _ in range(5):  # a loaded host may slow a quick execute past INLINE_MAX_NS: that attempt is tried again
        assert _until_inline(stream)[-1] == 1
        stream.send("slow", 1, {"report_thread": True, "delay_ms": 3 * INLINE_MAX_NS // 1_000_000})
        slow = [out for _, out, _, _ in stream.collect(2)]
        seen = _until_inline(stream)
        attempts.append((slow, seen))
        if slow == [[1], None] and len(seen) == INLINE_AFTER + 1:
            break
    assert slow == [[1], None], attempts  # it ran inline, and too long
    assert seen[0] == 0 and seen[-1] == 1 and len(seen) == INLINE_AFTER + 1, attempts


@pytest.mark.inferd_only
@pytest.mark.parametrize("how", ["execute", "join"])
def test_an_execute_on_the_main_thread_still_sees_its_cancellation(server, stream, tmp_path, how):
    """An execute running on the main thread (which then reads no socket) that waits for its request's
    cancellation, polling is_cancelled() itself or from a thread it joins, sees the Cancel; the worker then
    serves the next request."""
    assert _until_inline(stream)[-1] == 1
    marker = tmp_path / "marker"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    client.async_stream_infer("decoupled_repeat", [repeat_input(1)], request_id="w",
                              parameters={"wait_cancel": how, "marker": str(marker)})
    server.wait_until(lambda: marker.exists() and marker.read_text() == "waiting", WAIT_S, "execute to start waiting")
    client.stop_stream(cancel_requests=True)
    client.close()
    server.wait_until(lambda: marker.read_text() != "waiting", WAIT_S, "the execute to see its cancellation")
    assert marker.read_text() == "cancelled"
    stream.send("after", 2)
    assert [out for _, out, _, _ in stream.collect(3)] == [[0], [1], None]
