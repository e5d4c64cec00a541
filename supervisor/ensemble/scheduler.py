"""The ensemble scheduler: runs one request through the step graph as a dataflow.

Every step whose input tensors all exist is issued at once as an internal request to its composing
model (which applies its own scheduler, batching included), so independent steps run in parallel.
Outputs are mapped back into the request's tensor table; the response holds only the ensemble's
outputs. Intermediate tensors stay in their wire form (the composing models' result frames) and are
never decoded in the supervisor; above the inline limit they reach the next worker through a
shared-memory lease. A failing step fails the request and cancels the steps still running;
cancelling the request cancels them too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferRequest, InferResponse, RequestedOutput, Tensor
from ..tracing.record import UNTRACED
from .graph import EnsemblePlan, Step

# Runs one request on a composing model: resolve, validate, schedule, await its response.
CallModel = Callable[[InferRequest], Awaitable[InferResponse]]
# The same for a decoupled composing model: its responses as they come.
StreamModel = Callable[[InferRequest], AsyncIterator[InferResponse]]


class EnsembleScheduler:
    def __init__(self, plan: EnsemblePlan, version: str, call: CallModel, stream: StreamModel, stats: Any,
                 batched: bool = False) -> None:
        self.plan = plan
        self.version = version  # the ensemble's own, on its responses
        self.stream = stream
        self.batched = batched  # max_batch_size > 0: dim 0 of the inputs counts batch items
        self.call = call
        self.stats = stats
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- Scheduler shape ----
    def start(self) -> None:
        pass

    def instance_changed(self, executor: Any) -> None:
        pass

    @property
    def pending_count(self) -> int:
        return 0  # ensemble requests wait in their composing models' queues, counted there

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        if self._closed:
            raise InferdError(ErrorCode.UNAVAILABLE, "model '%s' is not accepting requests" % self.plan.name)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferResponse] = loop.create_future()
        task = loop.create_task(self._run(request, future), name="ensemble-" + self.plan.name)
        self._running.add(task)
        self._idle.clear()
        task.add_done_callback(self._task_done)
        # the caller cancelling the future cancels the steps in flight
        future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
        return future

    async def drain(self, timeout: float) -> None:
        self._closed = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def close(self) -> None:
        self._closed = True
        for task in list(self._running):
            task.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not self._running:
            self._idle.set()

    # ---- one request ----
    async def _run(self, request: InferRequest, future: asyncio.Future[InferResponse]) -> None:
        try:
            if self.plan.decoupled:
                response = await self._fan_out(request)
            else:
                response = await self._dataflow(request)
        except asyncio.CancelledError:
            self.stats.record_failure("CANCELED", time.monotonic_ns() - request.arrival_ns)
            if not future.done():
                future.cancel()
            return
        except InferdError as exc:
            self.stats.record_failure("BACKEND", time.monotonic_ns() - request.arrival_ns)
            if not future.done():
                future.set_exception(exc)
            return
        except Exception as exc:  # a bug on our side: answer, keep serving
            self.stats.record_failure("OTHER", time.monotonic_ns() - request.arrival_ns)
            if not future.done():
                future.set_exception(InferdError(ErrorCode.INTERNAL, "ensemble '%s' failed: %s"
                                                 % (self.plan.name, exc)))
            return
        self.stats.record_execution(self._batch_items(request))
        self.stats.record_success(1, time.monotonic_ns() - request.arrival_ns)
        if not future.done():
            future.set_result(response)

    def _tensors(self, request: InferRequest) -> dict[str, Tensor | None]:
        """The ensemble's tensor table at the start: the request's inputs, and None for every optional input
        it left out. None marks a tensor known to be absent (an input not given, an output a step did not
        produce): a step runs once each tensor it reads is present or absent and gets the present ones, as
        Triton runs it (its model decides whether what is missing was optional)."""
        tensors: dict[str, Tensor | None] = {t.name: t for t in request.inputs}
        for name in self.plan.inputs:
            tensors.setdefault(name, None)
        return tensors

    async def _dataflow(self, request: InferRequest) -> InferResponse:
        plan = self.plan
        tensors = self._tensors(request)
        waiting = {s.index: s for s in plan.steps}
        running: dict[asyncio.Task[InferResponse], Step] = {}
        try:
            while waiting or running:
                for index, step in list(waiting.items()):
                    if all(t in tensors for t in step.input_map.values()):
                        del waiting[index]
                        task = asyncio.ensure_future(self.call(self._step_request(request, step, tensors)))
                        running[task] = step
                if not running:  # cannot happen for a checked plan; never spin
                    raise InferdError(ErrorCode.INTERNAL, "ensemble '%s' stalled" % plan.name)
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    # a step error propagates and fails the request
                    self._map_outputs(running.pop(task), task.result(), tensors)
        finally:
            await _cancel_all(running)
        return self._response(request, tensors)

    # ---- ensembles with decoupled steps: every response of such a step feeds the later steps ----
    async def _fan_out(self, request: InferRequest) -> InferResponse:
        """Run the graph, forking the tensor table at each response of a decoupled step; every branch
        that completes is one response of the ensemble (to request.response_sink), then a final."""
        sink = request.response_sink
        if sink is None:
            raise InferdError(ErrorCode.UNSUPPORTED, "ensemble '%s' streams responses (it has a decoupled "
                              "step); use a streaming call" % self.plan.name)
        tensors = self._tensors(request)
        try:
            await self._branch(request, tensors, {s.index: s for s in self.plan.steps}, sink)
        except InferdError as exc:
            sink.put(exc, True)
            raise
        sink.put(InferResponse(self.plan.name, self.version, request.id), True)  # flag-only final
        return InferResponse(self.plan.name, self.version, request.id)

    async def _branch(self, request: InferRequest, tensors: dict[str, Tensor | None], waiting: dict[int, Step],
                      sink: Any) -> None:
        running: dict[asyncio.Task[InferResponse], Step] = {}
        try:
            while True:
                forks = []
                for index, step in list(waiting.items()):
                    if all(t in tensors for t in step.input_map.values()):
                        if index in self.plan.decoupled_steps:
                            forks.append(step)
                            continue
                        del waiting[index]
                        running[asyncio.ensure_future(self.call(self._step_request(request, step, tensors)))] = step
                if forks and not running:  # fork once everything else runnable has settled
                    step = forks[0]
                    del waiting[step.index]
                    await self._fork(request, step, tensors, waiting, sink)
                    return
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    self._map_outputs(running.pop(task), task.result(), tensors)
        finally:
            await _cancel_all(running)
        sink.put(self._response(request, tensors), False)

    async def _fork(self, request: InferRequest, step: Step, tensors: dict[str, Tensor | None],
                    waiting: dict[int, Step], sink: Any) -> None:
        branches: list[asyncio.Task[None]] = []
        slots = asyncio.Semaphore(self.plan.max_inflight) if self.plan.max_inflight else None
        try:
            async for response in self.stream(self._step_request(request, step, tensors)):
                if not response.outputs:
                    continue  # a flag-only final: nothing to pass on
                child = dict(tensors)
                self._map_outputs(step, response, child)
                if slots is not None:
                    await slots.acquire()  # back-pressure: the next response waits for a branch to end
                branch = asyncio.ensure_future(self._branch(request, child, dict(waiting), sink))
                if slots is not None:
                    branch.add_done_callback(_releaser(slots))
                branches.append(branch)
            await asyncio.gather(*branches)
        finally:
            for task in branches:
                task.cancel()

    def _map_outputs(self, step: Step, response: InferResponse, tensors: dict[str, Tensor | None]) -> None:
        produced = {t.name: t for t in response.outputs}
        for model_output, tensor_name in step.output_map.items():
            out = produced.get(model_output)
            # an output the step did not produce is absent: the steps reading it run without it (Triton)
            tensors[tensor_name] = None if out is None else Tensor(tensor_name, out.datatype, out.shape, out.data,
                                                                   device_ref=out.device_ref)

    def _response(self, request: InferRequest, tensors: dict[str, Tensor | None]) -> InferResponse:
        """The outputs asked for (all by default) that the steps produced; as Triton, one no step produced is
        left out of the response."""
        wanted = [o.name for o in request.outputs] or list(self.plan.outputs)
        outputs = [t for t in map(tensors.get, wanted) if t is not None]
        return InferResponse(self.plan.name, self.version, request.id, outputs)

    def _step_request(self, request: InferRequest, step: Step, tensors: dict[str, Tensor | None]) -> InferRequest:
        inputs = [Tensor(model_input, t.datatype, t.shape, t.data, device_ref=t.device_ref)
                  for model_input, t in ((k, tensors[name]) for k, name in step.input_map.items()) if t is not None]
        # a step's device outputs may stay on the GPU (for the next step's worker, by CUDA IPC handle)
        # unless one of them is an output of the ensemble going to a client: those leave as host bytes
        internal = request.device_outputs or not any(t in self.plan.outputs for t in step.output_map.values())
        return InferRequest(
            model_name=step.model_name, model_version=step.version_str, id=request.id, inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.output_map],
            parameters=request.parameters, correlation_id=request.correlation_id, flags=request.flags,
            priority=request.priority, timeout_us=request.timeout_us, device_outputs=internal,
            trace_parent=request.trace if request.trace is not None else UNTRACED)

    def _batch_items(self, request: InferRequest) -> int:
        if self.batched and request.inputs and request.inputs[0].shape:
            return max(1, request.inputs[0].shape[0])
        return 1


def _releaser(slots: asyncio.Semaphore) -> Callable[[asyncio.Task[None]], None]:
    return lambda _task: slots.release()


async def _cancel_all(running: dict[asyncio.Task[InferResponse], Step]) -> None:
    """Steps still running when their ensemble request ends (failed or cancelled): cancelled and awaited."""
    for task in running:
        task.cancel()
    if running:
        await asyncio.gather(*running, return_exceptions=True)
