"""Priorities and queue policies of the dynamic batcher, end to end with unmodified tritonclient.

Each test first blocks the model's single instance with a request that waits for a file, so that the
requests it sends next queue up (counted by nv_inference_pending_request_count); then it releases the
instance and checks, from the batch_probe model's ORDER output, in which order they ran.
Runs against Triton too (INFERD_E2E_TARGET=triton).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

MODELS = ["batch_probe_queue", "batch_probe_timeout", "batch_probe_delayed", "batch_probe_priority"]
WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


def probe_input(value: float = 0.0) -> list[InferInput]:
    inp = InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.full((1, 2), value, dtype=np.float32))
    return [inp]


def pending(server, model: str) -> int:
    pattern = re.compile(r'^nv_inference_pending_request_count\{[^}]*model="%s"[^}]*\}\s+(\S+)' % model, re.M)
    match = pattern.search(server.metrics())
    return int(float(match.group(1))) if match else 0


async def wait_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        await asyncio.sleep(0.01)


async def wait_pending(server, model: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while (n := await asyncio.to_thread(pending, server, model)) != count:
        assert time.monotonic() < deadline, f"{model}: {n} requests queued, expected {count}"
        await asyncio.sleep(0.02)


class Blocked:
    """The model's only instance runs a request that waits until `release()`."""

    def __init__(self, server, client: Any, model: str, tmp: Path) -> None:
        self.server, self.client, self.model = server, client, model
        self.release_file, self.started_file = tmp / f"{model}.release", tmp / f"{model}.started"
        self.task: asyncio.Future | None = None

    async def __aenter__(self) -> Blocked:
        self.task = self.send({"wait_file": str(self.release_file), "started_file": str(self.started_file)})
        await wait_file(self.started_file)
        return self

    def send(self, params: dict | None = None, priority: int = 0, timeout_us: int | None = None) -> asyncio.Future:
        return asyncio.ensure_future(self.client.infer(self.model, probe_input(), parameters=params,
                                                       priority=priority, timeout=timeout_us,
                                                       client_timeout=WAIT_S))

    def release(self) -> None:
        self.release_file.touch()

    async def __aexit__(self, *exc: Any) -> None:
        self.release()
        assert self.task is not None
        await asyncio.wait({self.task}, timeout=WAIT_S)


def order(result: Any) -> int:
    return int(result.as_numpy("ORDER")[0, 0])


def test_queue_overflow_is_rejected_unavailable(server, tmp_path):
    model = "batch_probe_queue"

    async def scenario():
        async with (grpcaio.InferenceServerClient(server.grpc_url) as client,
                   Blocked(server, client, model, tmp_path) as blocked):
            queued = [blocked.send() for _ in range(2)]
            await wait_pending(server, model, 2)
            with pytest.raises(InferenceServerException) as grpc_err:
                await client.infer(model, probe_input(), client_timeout=WAIT_S)
            http = httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S)
            http_input = httpclient.InferInput("INPUT0", [1, 2], "FP32")
            http_input.set_data_from_numpy(np.zeros((1, 2), dtype=np.float32))
            with pytest.raises(InferenceServerException) as http_err:
                await asyncio.to_thread(http.infer, model, [http_input])
            http.close()
            blocked.release()
            results = await asyncio.gather(*queued)
        return grpc_err.value, http_err.value, results

    grpc_err, http_err, results = asyncio.run(scenario())
    assert grpc_err.status() == "StatusCode.UNAVAILABLE"
    assert grpc_err.message() == "[request id: <id_unknown>] Exceeds maximum queue size"  # Triton's words
    assert http_err.status() == "503" or "503" in str(http_err.status())
    assert http_err.message() == "[request id: <id_unknown>] Exceeds maximum queue size"
    assert len(results) == 2  # the queued ones still run


def test_expired_request_is_rejected_with_reject_action(server, tmp_path):
    model = "batch_probe_timeout"

    async def scenario():
        async with (grpcaio.InferenceServerClient(server.grpc_url) as client,
                   Blocked(server, client, model, tmp_path) as blocked):
            sent = time.monotonic()
            short = blocked.send(timeout_us=200_000)  # may shorten the 60 s default
            kept = blocked.send()
            await wait_pending(server, model, 2)
            await asyncio.sleep(max(0.0, 0.2 - (time.monotonic() - sent)) + 0.1)  # let its 200 ms pass
            blocked.release()
            with pytest.raises(InferenceServerException) as err:
                await short
            return err.value, await kept

    err, kept = asyncio.run(scenario())
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert err.message() == "Request timeout expired"
    assert kept.as_numpy("OUTPUT0") is not None


@pytest.mark.inferd_only
def test_expired_request_is_rejected_while_the_instance_is_still_busy(server, tmp_path):
    """inferd rejects at the deadline, not when an instance next looks at the queue."""
    model = "batch_probe_timeout"

    async def scenario():
        async with (grpcaio.InferenceServerClient(server.grpc_url) as client,
                   Blocked(server, client, model, tmp_path) as blocked):
            start = time.monotonic()
            with pytest.raises(InferenceServerException) as err:
                await blocked.send(timeout_us=200_000)
            return err.value, time.monotonic() - start

    err, elapsed = asyncio.run(scenario())
    assert err.message() == "Request timeout expired"
    assert 0.19 <= elapsed < 5.0


def test_expired_request_waits_behind_the_others_with_delay_action(server, tmp_path):
    model = "batch_probe_delayed"

    async def scenario():
        async with (grpcaio.InferenceServerClient(server.grpc_url) as client,
                   Blocked(server, client, model, tmp_path) as blocked):
            sent = time.monotonic()
            expired = blocked.send(timeout_us=100_000)
            await wait_pending(server, model, 1)
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - sent)) + 0.1)  # let its 100 ms pass
            fresh = blocked.send()
            await wait_pending(server, model, 2)
            blocked.release()
            return await expired, await fresh

    expired, fresh = asyncio.run(scenario())
    assert order(fresh) < order(expired)


def test_priorities_reorder_a_backlog(server, tmp_path):
    model = "batch_probe_priority"

    async def scenario():
        async with (grpcaio.InferenceServerClient(server.grpc_url) as client,
                   Blocked(server, client, model, tmp_path) as blocked):
            low = [blocked.send(priority=2) for _ in range(3)]
            await wait_pending(server, model, 3)
            default = blocked.send()  # priority 0: the default level, 2
            await wait_pending(server, model, 4)
            high = [blocked.send(priority=1) for _ in range(3)]
            await wait_pending(server, model, 7)
            blocked.release()
            return (await asyncio.gather(*low), await default, await asyncio.gather(*high))

    low, default, high = asyncio.run(scenario())
    assert max(order(r) for r in high) < min(order(r) for r in low)
    assert max(order(r) for r in low) < order(default)  # FIFO within a level


@pytest.mark.inferd_only
def test_server_wide_max_queue_size_bounds_a_model_without_a_policy(server_factory, tmp_path):
    srv = server_factory(["batch_probe"], inferd_args=["--max-queue-size", "2"])
    model = "batch_probe"

    async def scenario():
        async with (grpcaio.InferenceServerClient(srv.grpc_url) as client,
                   Blocked(srv, client, model, tmp_path) as blocked):
            queued = [blocked.send() for _ in range(2)]
            await wait_pending(srv, model, 2)
            with pytest.raises(InferenceServerException) as err:
                await client.infer(model, probe_input(), client_timeout=WAIT_S)
            blocked.release()
            return err.value, await asyncio.gather(*queued)

    err, results = asyncio.run(scenario())
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert err.message() == "[request id: <id_unknown>] Exceeds maximum queue size"
    assert len(results) == 2
