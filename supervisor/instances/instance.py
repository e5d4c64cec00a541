"""A supervised instance slot: owns successive WorkerProcesses and restarts them with capped backoff.

- The first start's failure is raised (the model load fails with the worker's reason).
- After that, a worker that became ready and then died is always restarted: at once if it had been
  ready for at least `healthy_run_s`, else after `restart_base_s`, doubling while it keeps dying soon
  after ready (or failing to start), capped at `restart_cap_s`. A request that crashes its model
  (a poison request) therefore never takes the model away for good.
- Only failures to start count towards giving up: after `restart_give_up` failed restarts in a row
  the instance is FAILED with the last reason and nothing more is spawned.
- `on_change(instance)` is called on every state change so the model manager can recompute readiness.
- `warmup(worker)`, when set, runs on every worker after it loaded the model and before the instance
  is READY (the first start and every restart); its InferdError fails that start like a load error.
- Recycling (recycle.py): after max_requests requests or max_age seconds, or when asked (`recycle()`),
  a replacement worker starts while the current one keeps serving; once it is ready, new batches go to
  it and the old one answers what it holds, then stops. The instance stays READY throughout.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.inference.types import InferRequest
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from ..tracing import live
from ..tracing.record import watch_batch
from . import recycle
from .channel import Channel
from .external import ExternalLauncher
from .launcher import Launcher
from .results import BatchResult
from .worker import EXIT_REASONS, WorkerProcess

log = logging.getLogger("inferd.instances")


class InstanceState(str, enum.Enum):
    STARTING = "starting"  # first start in progress
    READY = "ready"
    RESTARTING = "restarting"  # waiting out the backoff delay, or a replacement is starting
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"  # first start failed, or gave up restarting


def backoff_delay(failures: int, base_s: float, cap_s: float) -> float:
    """Delay before the next start after `failures` consecutive failures (0: immediately)."""
    if failures <= 0:
        return 0.0
    return min(cap_s, base_s * (2.0 ** (failures - 1)))


class Instance:
    """One model instance (`load.instance_name`), kept alive by restarting its worker process."""

    def __init__(
        self,
        load: m.LoadModel,
        *,
        channel: Channel,
        launcher: Launcher | ExternalLauncher,
        timings: WorkerTimings,
        pool: Any = None,
        python: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        path_prefix: Sequence[str] = (),
        log_verbose: int = 0,
        on_change: Callable[[Instance], None] | None = None,
        warmup: Callable[[WorkerProcess], Awaitable[None]] | None = None,
        passive: bool = False,
        rate_limiter: Any = None,
    ) -> None:
        self.load = load
        self.passive = passive  # instance_group passive: loaded and supervised, but never scheduled
        self.rate_limiter = rate_limiter  # the group's rate_limiter (scheduler.rate_limiter.LimiterSpec) or None
        self.name = load.instance_name
        self.model_name = load.model_name
        self.state = InstanceState.STOPPED
        self.restarts = 0  # replacement processes spawned after the first
        self.restart_reasons = dict.fromkeys(EXIT_REASONS, 0)  # the same, by why the one before ended
        self._end_reason = "exit"  # why the last worker ended: the next restart's reason
        self.failures = 0  # consecutive failures (deaths soon after ready, failed restarts): the backoff
        self.start_failures = 0  # consecutive failed restarts: the only ones that lead to giving up
        self.last_error: InferdError | None = None
        self.on_change = on_change
        self.warmup = warmup
        self._channel = channel
        self._launcher = launcher
        self._timings = timings
        self._pool = pool
        self._python = python
        self._extra_env = extra_env
        self._path_prefix = tuple(path_prefix)
        self._log_verbose = log_verbose
        self._loop = asyncio.get_running_loop()
        self._worker: WorkerProcess | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # recycling: requests sent to the current worker, and the count at which it is replaced
        self._served = 0
        self._recycle_at = float("inf")
        self._age_timer: asyncio.TimerHandle | None = None
        self._recycling: asyncio.Task[bool] | None = None
        self._retiring: set[WorkerProcess] = set()  # replaced workers answering what they hold

    # ---- introspection ----
    @property
    def ready(self) -> bool:
        return self.state is InstanceState.READY

    @property
    def pid(self) -> int | None:
        w = self._worker
        return w.pid if w is not None and not w.exited else None

    @property
    def memory_limit(self) -> int | None:
        """Bytes a worker of this instance may use (--instance-memory-limit or the model's parameter)."""
        return self._timings.memory_limit_bytes

    @property
    def inflight(self) -> int:
        """Requests handed to this instance and not yet answered (queued at the worker included)."""
        return self._inflight

    @property
    def busy(self) -> bool:
        w = self._worker
        return w is not None and w.busy

    @property
    def recycles_by_count(self) -> bool:
        """Whether its worker is replaced after so many requests (counted here: the core must see each)."""
        return bool(self._timings.max_requests)

    @property
    def worker(self) -> WorkerProcess | None:
        return self._worker

    def _set_state(self, state: InstanceState) -> None:
        if state is self.state:
            return
        self.state = state
        if self.on_change is not None:
            try:
                self.on_change(self)
            except Exception:
                log.exception("on_change callback failed for instance '%s'", self.name)

    def _new_worker(self) -> WorkerProcess:
        return WorkerProcess(
            name=self.name,
            channel=self._channel,
            launcher=self._launcher,
            timings=self._timings,
            pool=self._pool,
            model_name=self.load.model_name,
            model_version=self.load.version,
            device=self.load.device_id if self.load.instance_kind == "GPU" else None,
            python=self._python,
            extra_env=self._extra_env,
            path_prefix=self._path_prefix,
            log_verbose=self._log_verbose,
            on_exit=self._on_worker_exit,
        )

    # ---- lifecycle ----
    async def start(self) -> None:
        """First start. Raises InferdError with the reason (the instance is then FAILED)."""
        self.failures = 0
        self.start_failures = 0
        self.last_error = None
        self._set_state(InstanceState.STARTING)
        worker = self._new_worker()
        self._worker = worker
        try:
            await self._start_worker(worker)
        except InferdError as exc:
            self.last_error = exc
            self._set_state(InstanceState.FAILED)
            raise
        except BaseException:
            self._set_state(InstanceState.FAILED)
            raise
        if self.state is InstanceState.STARTING:
            self._serving(worker)
            self._set_state(InstanceState.READY)

    async def _start_worker(self, worker: WorkerProcess) -> None:
        """Start `worker` and warm it up; a failed warm-up stops it again and raises InferdError."""
        await worker.start(self.load)
        if self.warmup is None:
            return
        try:
            await self.warmup(worker)
        except Exception as exc:
            await worker.stop(self._timings.stop_timeout_s)
            if isinstance(exc, InferdError):
                raise
            log.error("warmup of instance '%s' failed", self.name, exc_info=exc)
            raise InferdError(ErrorCode.INTERNAL, "warmup failed: %s" % exc) from None

    def _on_worker_exit(self, worker: WorkerProcess, err: InferdError) -> None:
        if worker is not self._worker or self.state is not InstanceState.READY:
            return
        self.last_error = err
        self._end_reason = worker.exit_reason or "exit"
        ran = self._loop.time() - (worker.ready_at or self._loop.time())
        if ran >= self._timings.healthy_run_s:
            self.failures = 0
        else:
            self.failures += 1
        self._schedule_restart()

    def _schedule_restart(self) -> None:
        t = self._timings
        if self.start_failures >= t.restart_give_up:
            log.error("instance '%s' of model '%s' failed to start %d times in a row; giving up: %s",
                      self.name, self.model_name, self.start_failures,
                      self.last_error.message if self.last_error else "")
            self._set_state(InstanceState.FAILED)
            return
        delay = backoff_delay(self.failures, t.restart_base_s, t.restart_cap_s)
        self._set_state(InstanceState.RESTARTING)
        self._restart_task = self._loop.create_task(self._restart(delay), name="restart-" + self.name)

    async def _restart(self, delay: float) -> None:
        if delay > 0:
            log.info("restarting instance '%s' of model '%s' in %.2f s", self.name, self.model_name, delay,
                     extra={"model": self.model_name, "instance": self.name})
            await asyncio.sleep(delay)
        self.restarts += 1
        self.restart_reasons[self._end_reason] = self.restart_reasons.get(self._end_reason, 0) + 1
        worker = self._new_worker()
        self._worker = worker
        try:
            await self._start_worker(worker)
        except InferdError as exc:
            if self.state is InstanceState.RESTARTING:
                self.last_error = exc
                self._end_reason = worker.exit_reason or "exit"
                self.failures += 1
                self.start_failures += 1
                self._schedule_restart()
            return
        if self.state is not InstanceState.RESTARTING:  # drained meanwhile
            await worker.stop()
            return
        log.info("instance '%s' of model '%s' restarted (pid %s)", self.name, self.model_name, worker.pid,
                 extra={"model": self.model_name, "instance": self.name})
        self.start_failures = 0
        self._serving(worker)
        self._set_state(InstanceState.READY)

    async def drain_and_stop(self, timeout: float | None = None) -> None:
        """Stop taking work, wait up to `timeout` for requests in flight, then stop the worker."""
        if self.state is InstanceState.STOPPED and self._worker is None:
            return
        self._set_state(InstanceState.DRAINING)
        self._no_recycling()
        for task in (self._restart_task, self._recycling):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task})  # a start in progress kills and reaps its process
        self._restart_task = self._recycling = None
        if self._inflight:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("instance '%s': %d requests still in flight after %s s; stopping anyway",
                            self.name, self._inflight, timeout)
        worker = self._worker
        stopping = [w for w in (worker, *self._retiring) if w is not None]
        await asyncio.gather(*(w.stop(self._timings.stop_timeout_s) for w in stopping))
        self._set_state(InstanceState.STOPPED)

    # ---- work ----
    async def execute(self, requests: Sequence[InferRequest]) -> BatchResult:
        """Run a batch on this instance; InferdError(UNAVAILABLE) when it is not ready or dies meanwhile."""
        return await self.launch(requests)

    def launch(self, requests: Sequence[InferRequest],
               on_free: Callable[[], None] | None = None) -> asyncio.Future[BatchResult]:
        """Send a batch now (see WorkerProcess.launch); the future resolves to its BatchResult."""
        worker = self._worker
        if self.state is not InstanceState.READY or worker is None:
            raise self._not_ready()
        traced = live.armed  # tracing: the one check a batch pays while it is off
        sent_ns = time.monotonic_ns() if traced else 0  # before the send: the worker may start at once
        fut = worker.launch(requests, self._batch_done, on_free)
        if traced:
            watch_batch(fut, requests, self.name, sent_ns)
        if not self._inflight:  # (idle is set only at 0 in flight: clear already otherwise)
            self._idle.clear()
        self._inflight += len(requests)
        self._served += len(requests)
        if self._served >= self._recycle_at:
            self._recycle_soon("max_requests")
        return fut

    def _batch_done(self, n: int) -> None:
        """A batch of `n` requests launched here is done (run by the pipeline when its future is)."""
        self._inflight -= n
        if not self._inflight:
            self._idle.set()

    # ---- recycling (recycle.py) ----
    def _serving(self, worker: WorkerProcess) -> None:
        """`worker` has become the one taking this instance's work: its recycling thresholds start."""
        t = self._timings
        self._served = 0
        self._recycle_at = recycle.spread(t.max_requests) if t.max_requests else float("inf")
        if self._age_timer is not None:
            self._age_timer.cancel()
            self._age_timer = None
        if t.max_age_s:
            self._age_timer = self._loop.call_later(recycle.spread(t.max_age_s), self._recycle_soon, "max_age")

    def _no_recycling(self) -> None:
        self._recycle_at = float("inf")
        if self._age_timer is not None:
            self._age_timer.cancel()
            self._age_timer = None

    def _recycle_soon(self, why: str) -> None:
        self._age_timer = None
        self._recycle_at = float("inf")  # once per worker: a replacement that fails to start is not retried
        if self._recycling is None and self.state is InstanceState.READY:
            self._recycling = self._loop.create_task(self._recycle(why), name="recycle-" + self.name)

    async def recycle(self, why: str = "asked") -> bool:
        """Replace the worker without a gap: start a new one while the current keeps serving, switch new
        batches to it once it is ready, then let the old one answer what it holds and stop it. True when
        replaced; False when the instance is not READY or the replacement failed to start (the current
        worker then goes on serving). A recycle already under way is joined."""
        task = self._recycling
        if task is None:  # a task, so that a drain can cancel it and other callers join it
            task = self._recycling = self._loop.create_task(self._recycle(why), name="recycle-" + self.name)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # a drain or unload stopped the recycle, not our caller
                return False
            raise

    async def _recycle(self, why: str) -> bool:
        try:
            old = self._worker
            if self.state is not InstanceState.READY or old is None:
                return False
            log.info("recycling instance '%s' of model '%s' (pid %s, %s, %d requests)", self.name,
                     self.model_name, old.pid, why, self._served,
                     extra={"model": self.model_name, "instance": self.name})
            new = self._new_worker()
            try:
                await self._start_worker(new)
            except InferdError as exc:
                log.warning("instance '%s' of model '%s': its replacement failed to start; the current worker "
                            "(pid %s) goes on serving: %s", self.name, self.model_name, old.pid, exc.message)
                return False
            if self.state is not InstanceState.READY or self._worker is not old:  # drained or died meanwhile
                await new.stop(self._timings.stop_timeout_s)
                return False
            self._worker = new  # new batches go to the replacement from here on
            old.exit_reason = "recycled"
            self.restarts += 1
            self.restart_reasons["recycled"] = self.restart_reasons.get("recycled", 0) + 1
            self._serving(new)
            if self.on_change is not None:
                self.on_change(self)  # (same state; the pid and counts changed)
            self._retiring.add(old)
        finally:
            if self._recycling is asyncio.current_task():
                self._recycling = None
        try:
            await self._retire(old)
        finally:
            self._retiring.discard(old)
        log.info("instance '%s' of model '%s' recycled (pid %s -> %s)", self.name, self.model_name, old.pid,
                 new.pid, extra={"model": self.model_name, "instance": self.name})
        return True

    async def _retire(self, old: WorkerProcess) -> None:
        """Let a replaced worker answer its batches (and finish its decoupled streams), then stop it."""
        deadline = self._loop.time() + recycle.RETIRE_TIMEOUT_S
        # no event tells when one worker of the instance is empty: look every 5 ms while it drains
        while old.held and not old.exited and self._loop.time() < deadline:
            await asyncio.sleep(0.005)
        if old.held and not old.exited:
            log.warning("instance '%s': the replaced worker (pid %s) still holds %d batches or streams after %g s; "
                        "stopping it", self.name, old.pid, old.held, recycle.RETIRE_TIMEOUT_S)
        await old.stop(self._timings.stop_timeout_s)

    async def stop(self) -> None:
        """Stop now (the scheduler has drained): requests still in flight fail with UNAVAILABLE."""
        await self.drain_and_stop(0)

    def cancel(self, requests: Iterable[InferRequest]) -> None:
        if self._worker is not None:
            self._worker.cancel(requests)

    def _not_ready(self) -> InferdError:
        msg = f"instance '{self.name}' of model '{self.model_name}' is not ready ({self.state.value})"
        if self.last_error is not None and self.state in (InstanceState.RESTARTING, InstanceState.FAILED):
            msg += ": " + self.last_error.message
        return InferdError(ErrorCode.UNAVAILABLE, msg)


async def run_autocomplete(
    msg: m.AutoComplete,
    *,
    channel: Channel,
    launcher: Launcher,
    timings: WorkerTimings,
    python: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    path_prefix: Sequence[str] = (),
    log_verbose: int = 0,
) -> str:
    """Auto-complete a model config in a throw-away worker; returns the completed config JSON."""
    worker = WorkerProcess(
        name=f"{msg.model_name}_autocomplete",
        channel=channel,
        launcher=launcher,
        timings=timings,
        model_name=msg.model_name,
        python=python,
        extra_env=extra_env,
        path_prefix=path_prefix,
        log_verbose=log_verbose,
    )
    return await worker.autocomplete(msg)
