"""In-process stand-ins for instances and the stats sink, for the scheduler unit tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from inferd.supervisor.inference.types import InferRequest, InferResponse

WAIT_S = 10.0


@dataclass
class Result:
    responses: list[Any]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    execution_items: int | None = None  # (instances.results.BatchResult's: set when the worker merged batches)


class HeldExecutor:
    """Runs nothing: each batch waits for `release()`, then answers every request with its id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = True
        self.batches: list[list[str]] = []
        self.cancelled: list[str] = []
        self._gates: list[asyncio.Future[None]] = []
        self.arrived = asyncio.Event()

    async def execute(self, requests: list[InferRequest]) -> Result:
        self.batches.append([r.id for r in requests])
        gate = asyncio.get_running_loop().create_future()
        self._gates.append(gate)
        self.arrived.set()
        await gate
        return Result([InferResponse("m", "1", id=r.id) for r in requests])

    def launch(self, requests: list[InferRequest], on_free: Any = None) -> asyncio.Future[Result]:
        return asyncio.ensure_future(self.execute(requests))  # never calls on_free (an instance may not)

    def release(self, index: int = 0) -> None:
        self._gates[index].set_result(None)

    def cancel(self, requests: Any) -> None:
        self.cancelled.extend(r.id for r in requests)


@dataclass
class Stats:
    executions: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    successes: int = 0

    def record_success(self, *args: Any) -> None:
        self.successes += 1

    def record_successes(self, arrivals: Any, *args: Any) -> None:
        self.successes += len(arrivals)

    def record_failure(self, reason: str, request_ns: int) -> None:
        self.failures.append(reason)

    def record_execution(self, batch_size: int, *args: Any) -> None:
        self.executions.append(batch_size)


async def until(predicate, what: str) -> None:
    async def poll():
        while not predicate():
            await asyncio.sleep(0.001)
    try:
        await asyncio.wait_for(poll(), WAIT_S)
    except asyncio.TimeoutError:
        pytest.fail("timed out waiting for " + what)


async def release_when_sent(ex: HeldExecutor, index: int) -> None:
    await until(lambda: len(ex.batches) > index, "batch %d" % index)
    ex.release(index)
