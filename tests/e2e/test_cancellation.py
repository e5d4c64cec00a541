"""Cancellation from the frontends: a cancelled gRPC call (client timeout, aio cancel), a closed gRPC
stream and a dropped HTTP connection take the request out of its queue, or make the running Python
model see `request.is_cancelled()`; cancelled requests are counted CANCELED, never run after the
cancel was seen, and give their shared memory back.

The cancel_slow model (one instance) runs up to SECONDS, polling is_cancelled(), and leaves marker
files started_<TAG> / cancelled_<TAG> / done_<TAG> in the directory named by the request parameter
marker_dir. Runs against the real Triton too (INFERD_E2E_TARGET=triton) except the inferd_only tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

MODEL = "cancel_slow"
BATCHED = "cancel_batched"  # the same model behind the dynamic batcher (inputs with a batch dimension)
LONG_S = 120.0  # a request that would run this long unless cancelled
WAIT_S = 30.0  # bound on every wait for something the server does
SHM_INPUT_BYTES = 1 << 20  # well above the 64 KiB inline limit: travels through a shared memory lease
LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')


def grpc_inputs(tag: str, seconds: float, nbytes: int = 4, model: str = MODEL) -> list:
    values = (("TAG", "BYTES", np.array([tag.encode()], dtype=np.object_)),
              ("SECONDS", "FP32", np.array([seconds], dtype=np.float32)),
              ("DATA", "UINT8", np.zeros(nbytes, dtype=np.uint8)))
    inputs = []
    for name, dtype, value in values:
        if model == BATCHED:
            value = value[np.newaxis]  # a batch of one
        inp = grpcclient.InferInput(name, list(value.shape), dtype)
        inp.set_data_from_numpy(value)
        inputs.append(inp)
    return inputs


def http_body(tag: str, seconds: float, marker_dir: Path) -> bytes:
    return json.dumps({"inputs": [
        {"name": "TAG", "datatype": "BYTES", "shape": [1], "data": [tag]},
        {"name": "SECONDS", "datatype": "FP32", "shape": [1], "data": [seconds]},
        {"name": "DATA", "datatype": "UINT8", "shape": [4], "data": [0, 0, 0, 0]},
    ], "parameters": {"marker_dir": str(marker_dir)}}).encode()


def marker(marker_dir: Path, kind: str, tag: str) -> Path:
    return marker_dir / f"{kind}_{tag}"


def wait_marker(server, marker_dir: Path, kind: str, tag: str) -> None:
    path = marker(marker_dir, kind, tag)
    server.wait_until(path.exists, timeout=WAIT_S, what=f"the model to leave {path.name}")


async def async_wait_marker(marker_dir: Path, kind: str, tag: str) -> None:
    path = marker(marker_dir, kind, tag)
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for the model to leave {path.name}"
        await asyncio.sleep(0.02)


def samples(server, model: str = MODEL) -> dict[tuple[str, str], float]:
    """Metrics of `model` (and the unlabelled server-wide ones) by (name, reason label)."""
    out: dict[tuple[str, str], float] = {}
    for line in server.metrics().splitlines():
        m = LINE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels") or ""))
        if labels.get("model", model) != model:
            continue
        key = (m.group("name"), labels.get("reason", ""))
        out[key] = out.get(key, 0.0) + float(m.group("value"))
    return out


def canceled_count(server, model: str = MODEL) -> float:
    return samples(server, model)[("nv_inference_request_failure", "CANCELED")]


def wait_canceled(server, harness, expected: float, model: str = MODEL) -> None:
    if harness.target_is_triton():
        return  # Triton 2.51 counts a cancelled gRPC request nowhere (neither fail nor CANCELED)
    server.wait_until(lambda: canceled_count(server, model) == expected, timeout=WAIT_S,
                      what=f"{expected:g} requests counted CANCELED")


def assert_serves(server, marker_dir: Path, tag: str, model: str = MODEL) -> None:
    """The server and the model still answer a quick request."""
    client = server.grpc_client()
    try:
        result = client.infer(model, grpc_inputs(tag, 0.0, model=model),
                              parameters={"marker_dir": str(marker_dir)}, client_timeout=WAIT_S)
    finally:
        client.close()
    assert result.as_numpy("NBYTES").reshape(-1)[0] == 4
    assert server.is_live() and server.model_ready(model)


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory([MODEL, BATCHED])


@pytest.fixture
def marker_dir(tmp_path) -> Path:
    d = tmp_path / "markers"
    d.mkdir()
    return d


def test_grpc_client_timeout_cancels_the_running_request(server, marker_dir, harness):
    before = canceled_count(server)
    client = server.grpc_client()
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer(MODEL, grpc_inputs("timeout", LONG_S), parameters={"marker_dir": str(marker_dir)},
                         client_timeout=3.0)
    finally:
        client.close()
    assert "Deadline" in str(err.value) or "DEADLINE" in str(err.value.status())
    wait_marker(server, marker_dir, "started", "timeout")
    wait_marker(server, marker_dir, "cancelled", "timeout")
    wait_canceled(server, harness, before + 1)
    assert not marker(marker_dir, "done", "timeout").exists()
    assert_serves(server, marker_dir, "after_timeout")


def test_grpc_aio_cancel_reaches_the_model(server, marker_dir, harness):
    before = canceled_count(server)

    async def scenario() -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            call = asyncio.ensure_future(client.infer(MODEL, grpc_inputs("aio", LONG_S),
                                                      parameters={"marker_dir": str(marker_dir)}))
            await async_wait_marker(marker_dir, "started", "aio")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await async_wait_marker(marker_dir, "cancelled", "aio")
        finally:
            await client.close()

    asyncio.run(scenario())
    wait_canceled(server, harness, before + 1)
    assert not marker(marker_dir, "done", "aio").exists()
    assert_serves(server, marker_dir, "after_aio")


@pytest.mark.inferd_only  # Triton notices a dropped HTTP connection only when it writes the answer (#7077)
def test_dropped_http_connection_cancels_the_running_request(server, marker_dir, harness):
    before = canceled_count(server)
    body = http_body("http", LONG_S, marker_dir)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=WAIT_S) as sock:
        sock.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (MODEL.encode(), len(body), body))
        wait_marker(server, marker_dir, "started", "http")
    # the socket is closed: the supervisor sees the connection go and cancels the request
    wait_marker(server, marker_dir, "cancelled", "http")
    wait_canceled(server, harness, before + 1)
    assert not marker(marker_dir, "done", "http").exists()
    assert_serves(server, marker_dir, "after_http")


@pytest.mark.inferd_only  # as above: Triton does not notice the closed connection
def test_tritonclient_http_timeout_cancels_the_running_request(server, marker_dir, harness):
    import tritonclient.http as httpclient

    before = canceled_count(server)
    client = server.http_client(network_timeout=3.0)  # on timeout the client closes its connection
    inputs = []
    for name, dtype, value in (("TAG", "BYTES", np.array([b"http_timeout"], dtype=np.object_)),
                               ("SECONDS", "FP32", np.array([LONG_S], dtype=np.float32)),
                               ("DATA", "UINT8", np.zeros(4, dtype=np.uint8))):
        inp = httpclient.InferInput(name, list(value.shape), dtype)
        inp.set_data_from_numpy(value)
        inputs.append(inp)
    try:
        with pytest.raises(Exception, match="timed out"):
            client.infer(MODEL, inputs, parameters={"marker_dir": str(marker_dir)})
    finally:
        client.close()
    wait_marker(server, marker_dir, "started", "http_timeout")
    wait_marker(server, marker_dir, "cancelled", "http_timeout")
    wait_canceled(server, harness, before + 1)
    assert_serves(server, marker_dir, "after_http_timeout")


def test_closed_grpc_stream_cancels_its_requests(server, marker_dir, harness):
    before = canceled_count(server)
    results: queue.Queue = queue.Queue()
    client = server.grpc_client()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(MODEL, grpc_inputs("stream", LONG_S), parameters={"marker_dir": str(marker_dir)})
        wait_marker(server, marker_dir, "started", "stream")
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    wait_marker(server, marker_dir, "cancelled", "stream")
    wait_canceled(server, harness, before + 1)
    assert not marker(marker_dir, "done", "stream").exists()
    assert_serves(server, marker_dir, "after_stream")


def _queue_depth(server, model: str = MODEL) -> float:
    """Requests of the model queued or sent to its instance and not yet answered."""
    s = samples(server, model)
    return s.get(("nv_inference_pending_request_count", ""), 0.0) + s.get(
        ("inferd_instance_inflight_requests", ""), 0.0)


@pytest.mark.inferd_only  # Triton 2.51's default scheduler still hands it to the model (which sees it cancelled)
@pytest.mark.parametrize("model", [MODEL, BATCHED])
def test_queued_request_is_cancelled_and_never_executes(server, marker_dir, harness, model):
    before = canceled_count(server, model)
    depth = 2  # the running request (sent to the instance) and the queued one

    async def scenario() -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)
        params = {"marker_dir": str(marker_dir)}
        try:
            running = asyncio.ensure_future(
                client.infer(model, grpc_inputs("running", LONG_S, model=model), parameters=params))
            await async_wait_marker(marker_dir, "started", "running")
            queued = asyncio.ensure_future(
                client.infer(model, grpc_inputs("queued", LONG_S, model=model), parameters=params))
            deadline = time.monotonic() + WAIT_S
            while _queue_depth(server, model) < depth:  # the second request has reached the server
                assert time.monotonic() < deadline, "the queued request never reached the server"
                await asyncio.sleep(0.02)
            queued.cancel()
            running.cancel()
            await async_wait_marker(marker_dir, "cancelled", "running")
            for call in (queued, running):
                with pytest.raises(asyncio.CancelledError):
                    await call
        finally:
            await client.close()

    asyncio.run(scenario())
    wait_canceled(server, harness, before + 2, model)
    # a later request runs after the place the cancelled one held: it was skipped, not deferred
    assert_serves(server, marker_dir, "later", model)
    assert marker(marker_dir, "done", "later").exists()
    assert not marker(marker_dir, "started", "queued").exists(), "the cancelled queued request was executed"


@pytest.mark.inferd_only  # inferd's shared memory: /dev/shm/inferd_* and inferd_shm_bytes_in_use
def test_cancelled_large_inputs_leave_no_shared_memory_behind(server, marker_dir, harness):
    pids = {server.pid, *server.worker_pids(MODEL)}

    def owned() -> dict[str, int]:
        return {n: s for n, s in harness.shm_snapshot().items() if harness.shm_owner(n) in pids}

    async def one_round(client, n: int) -> None:
        params = {"marker_dir": str(marker_dir)}
        running = asyncio.ensure_future(client.infer(
            MODEL, grpc_inputs(f"big{n}", LONG_S, SHM_INPUT_BYTES), parameters=params))
        await async_wait_marker(marker_dir, "started", f"big{n}")
        queued = asyncio.ensure_future(client.infer(
            MODEL, grpc_inputs(f"bigq{n}", LONG_S, SHM_INPUT_BYTES), parameters=params))
        deadline = time.monotonic() + WAIT_S
        while _queue_depth(server) < 2:
            assert time.monotonic() < deadline, "the queued request never reached the server"
            await asyncio.sleep(0.02)
        queued.cancel()
        running.cancel()
        await async_wait_marker(marker_dir, "cancelled", f"big{n}")
        deadline = time.monotonic() + WAIT_S
        while in_use() != 0:  # both leases come back once the worker has answered (or skipped) them
            assert time.monotonic() < deadline, f"shared memory still leased after round {n}: {in_use()}"
            await asyncio.sleep(0.02)

    def in_use() -> float:
        return samples(server).get(("inferd_shm_bytes_in_use", ""), -1.0)

    async def scenario(rounds: range) -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            for n in rounds:
                await one_round(client, n)
        finally:
            await client.close()

    before = canceled_count(server)
    asyncio.run(scenario(range(1)))
    after_one = owned()
    asyncio.run(scenario(range(1, 4)))
    after_four = owned()
    # regions are pooled and reused: more cancelled requests must not mean more regions
    assert len(after_four) <= len(after_one), (sorted(after_one), sorted(after_four))
    assert sum(after_four.values()) <= sum(after_one.values())
    wait_canceled(server, harness, before + 8)
    for n in range(4):
        assert not marker(marker_dir, "started", f"bigq{n}").exists()
    assert_serves(server, marker_dir, "after_big")
    # the worker's view of the regions is still consistent: a large input that is not cancelled works
    client = server.grpc_client()
    try:
        result = client.infer(MODEL, grpc_inputs("big_ok", 0.0, SHM_INPUT_BYTES),
                              parameters={"marker_dir": str(marker_dir)}, client_timeout=WAIT_S)
    finally:
        client.close()
    assert result.as_numpy("NBYTES")[0] == SHM_INPUT_BYTES
    assert os.path.isdir(marker_dir)
