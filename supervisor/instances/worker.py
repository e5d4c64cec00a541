"""One live worker process and the supervisor's side of its protocol (docs/worker-protocol.md).

State machine: starting → ready → draining → stopped | failed. Death is detected by awaiting the
process exit (a per-child wait); a heartbeat watchdog SIGKILLs a worker that went silent and is
stopped (SIGSTOP) or makes no CPU progress (deadlocked), so that it takes the same path; a silent worker
that uses CPU is busy (a long C call holding the GIL), not hung (liveness.py). On any exit that was
not requested, every request in flight fails at once with UNAVAILABLE naming the instance, its pid
and the cause, and `on_exit` is told.

Decoupled requests stay open after their batch's ExecuteResult until their final StreamResponse;
streams.py keeps them.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import itertools
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from inferd.supervisor import logs
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.inference.types import InferRequest
from inferd.worker.wire import messages as m
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

from . import codec, liveness
from .channel import Channel
from .codec import BatchResult
from .external import ExternalLauncher
from .launcher import Bootstrap, Launcher
from .outputs import WorkerOutputs
from .packing import InputPacker, release_leases
from .streams import OpenStreams

log = logging.getLogger("inferd.instances.worker")

_identities = itertools.count(1)
STARTING_SILENCE_S = 15.0  # heartbeat silence tolerated while a worker starts and loads its model
_LOG_LEVELS = {
    "ERROR": logging.ERROR, "WARNING": logging.WARNING, "INFO": logging.INFO, "VERBOSE": logging.DEBUG,
}


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class _Batch:
    __slots__ = ("batch_id", "fut", "requests", "ids", "leases", "on_free")

    def __init__(self, batch_id: int, fut: asyncio.Future[BatchResult], requests: Sequence[InferRequest],
                 ids: list[int], leases: list[Any], on_free: Callable[[], None] | None = None) -> None:
        self.batch_id = batch_id
        self.fut = fut
        self.requests = requests
        self.ids = ids
        self.leases = leases
        self.on_free = on_free  # the scheduler's: told as the result arrives, before it is read


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


class WorkerProcess:
    """One worker process for one model instance (or one throw-away auto-complete run)."""

    def __init__(
        self,
        *,
        name: str,
        channel: Channel,
        launcher: Launcher | ExternalLauncher,
        timings: WorkerTimings,
        pool: Any = None,  # memory.shm_pool.ShmPool; None: inputs above INLINE_MAX_BYTES are refused
        model_name: str = "",
        model_version: str = "",
        python: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        path_prefix: Sequence[str] = (),
        log_verbose: int = 0,
        on_exit: Callable[[WorkerProcess, InferdError], None] | None = None,
        device: int | None = None,  # the GPU of a KIND_GPU instance (client CUDA inputs go by handle)
    ) -> None:
        self.name = name
        self.model_name = model_name
        self.model_version = model_version
        self.identity = f"w{next(_identities)}"
        self.state = WorkerState.STARTING
        self.hello: m.Hello | None = None
        self.ready_at: float | None = None  # loop time when it became ready
        self.error: InferdError | None = None  # why it failed
        self.returncode: int | None = None
        self._channel = channel
        self._launcher = launcher
        self._timings = timings
        self._python = python
        self._extra_env = extra_env
        self._path_prefix = tuple(path_prefix)
        self._log_verbose = log_verbose
        self._on_exit = on_exit
        self._loop = asyncio.get_running_loop()
        # an asyncio process, or an external.ExternalProcess (a worker hosted by the API user's process)
        self._proc: Any = None
        self._exited = asyncio.Event()
        self._exit_task: asyncio.Task[None] | None = None
        self._hb_task: asyncio.Task[None] | None = None
        self._last_hb = 0.0
        self._control: dict[type, asyncio.Future[Any]] = {}
        self._stopping = False
        self._kill_reason = ""
        # Up to max_inflight batches are sent ahead, so the worker starts the next one without waiting
        # for a round trip; it still executes them one at a time, in order.
        self.max_inflight = max(1, timings.pipeline_depth)
        self._batches: dict[int, _Batch] = {}
        self._streams = OpenStreams(lambda rid: self._send_quiet(m.Cancel([rid])), self._kill)
        self._slots = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._batch_ids = itertools.count(1)
        self._packer = InputPacker(pool, device)
        # large outputs the worker wrote into its own regions; their names go back once collected
        self._outputs = WorkerOutputs(lambda names: self._send_quiet(m.ReleaseOutputs(names)), self.identity, name,
                                      lambda keys: self._send_quiet(m.ReleaseOutputs([], keys)))
        self._hb_frames = m.encode(m.Heartbeat(0))
        self._log = logging.getLogger(f"inferd.worker.{name}")

    # ---- introspection ----
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def busy(self) -> bool:
        return self._slots >= self.max_inflight

    @property
    def inflight(self) -> int:
        return sum(len(b.requests) for b in self._batches.values())

    @property
    def open_streams(self) -> int:
        """Decoupled requests that have not received their final response."""
        return len(self._streams)

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    async def wait_exit(self) -> None:
        await self._exited.wait()

    def _who(self) -> str:
        who = f"instance '{self.name}'"
        if self.model_name:
            who = f"model '{self.model_name}' {who}"
        if self._proc is not None:
            who += f" (pid {self._proc.pid})"
        return who

    # ---- start-up ----
    async def start(self, load: m.LoadModel) -> None:
        """Spawn, handshake, load the model. Raises InferdError with the reason; leaves no process behind."""
        try:
            await self._spawn_and_hello()
            self._send(m.LogSettings(*logs.worker_levels()))  # the current ones, also if changed since start
            self._send(load)
            timeout = self._timings.load_timeout_s
            result: m.LoadResult = await self._expect(m.LoadResult, timeout, "model load")
            if result.error is not None:
                raise InferdError(ErrorCode(result.error.code), result.error.message)
        except BaseException as exc:
            await self._abort(exc)
            raise
        self.state = WorkerState.READY
        self.ready_at = self._loop.time()

    async def autocomplete(self, msg: m.AutoComplete) -> str:
        """Run the backend's auto-complete in this (throw-away) worker; returns the config JSON."""
        try:
            await self._spawn_and_hello()
            self._send(msg)
            result: m.AutoCompleteResult = await self._expect(
                m.AutoCompleteResult, self._timings.autocomplete_timeout_s, "config auto-complete"
            )
        except BaseException as exc:
            await self._abort(exc)
            raise
        await self.stop()
        if result.error is not None:
            raise InferdError(ErrorCode(result.error.code), result.error.message)
        return result.config_json

    async def _spawn_and_hello(self) -> None:
        t = self._timings
        self._channel.register(self.identity, self._on_message, self._on_heartbeat,
                               lambda reason: self._kill(f"broke the worker protocol ({reason})"))
        boot = Bootstrap(
            endpoint=self._channel.endpoint,
            identity=self.identity,
            instance_name=self.name,
            supervisor_pid=os.getpid(),
            heartbeat_interval_s=t.heartbeat_interval_s,
            heartbeat_timeout_s=max(t.heartbeat_interval_s * t.heartbeat_misses * 2, STARTING_SILENCE_S),
            log_verbose=self._log_verbose,
            log_format=logs.current_format(),
        )
        hello_fut = self._expect_future(m.Hello)
        self._proc = await self._launcher.spawn(
            boot, python=self._python, extra_env=self._extra_env, path_prefix=self._path_prefix
        )
        self._exit_task = self._loop.create_task(self._watch_exit(self._proc), name="exit-" + self.name)
        hello: m.Hello = await self._await_control(hello_fut, t.spawn_timeout_s, "start-up (spawn to Hello)")
        if hello.wire_version != m.WIRE_VERSION:
            raise InferdError(
                ErrorCode.INTERNAL,
                f"{self._who()} speaks wire version {hello.wire_version}, the server {m.WIRE_VERSION}"
                f" (python {hello.python_version})",
            )
        if hello.pid != self._proc.pid:
            log.warning("%s reports pid %s", self._who(), hello.pid)
        self.hello = hello
        self._last_hb = self._loop.time()
        self._hb_task = self._loop.create_task(self._heartbeat_loop(), name="hb-" + self.name)

    def _expect_future(self, cls: type) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._control[cls] = fut
        if self.error is not None:  # already dead
            fut.set_exception(self.error)
        return fut

    async def _expect(self, cls: type, timeout: float, stage: str) -> Any:
        return await self._await_control(self._expect_future(cls), timeout, stage)

    async def _await_control(self, fut: asyncio.Future[Any], timeout: float, stage: str) -> Any:
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise InferdError(
                ErrorCode.UNAVAILABLE, f"{self._who()}: {stage} timed out after {timeout:g} s"
            ) from None

    async def _abort(self, exc: BaseException) -> None:
        """A start that failed: kill, reap, mark failed (even when the caller was cancelled)."""
        self._stopping = True
        if self.error is None:
            self.error = exc if isinstance(exc, InferdError) else InferdError(ErrorCode.INTERNAL, str(exc))
        self.state = WorkerState.FAILED
        self._kill("start failed")
        await asyncio.shield(self._reap())

    async def _reap(self) -> None:
        if self._exit_task is not None:
            await self._exit_task
        else:
            self._cleanup()

    # ---- execution ----
    async def execute(self, requests: Sequence[InferRequest]) -> BatchResult:
        """Run one batch. Up to max_inflight Executes are in flight per worker; callers queue here (FIFO).

        Raises InferdError(UNAVAILABLE) when the worker is not ready or dies meanwhile. Cancelling the
        caller sends Cancel to the worker; the batch still occupies the worker until its reply.
        """
        if self.state is not WorkerState.READY:
            raise self._not_ready()
        if self._slots >= self.max_inflight:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release_slot()  # ownership was handed over just before the cancel
                raise
            if self.state is not WorkerState.READY:
                self._release_slot()
                raise self._not_ready()
        else:
            self._slots += 1
        return await self._send_batch(requests)

    def launch(self, requests: Sequence[InferRequest],
               on_free: Callable[[], None] | None = None) -> asyncio.Future[BatchResult]:
        """`execute` without a coroutine when a pipeline slot is free: the Execute is sent before this
        returns, and the future resolves as the result is read (schedulers' callback path). With the
        pipeline full it falls back to waiting in `execute`'s queue (and `on_free` is not called).
        Cancelling the future sends Cancel. `on_free()` runs as the result arrives, before it is read:
        the scheduler's next batch leaves while this one's answers are still to be split."""
        if self.state is not WorkerState.READY:
            raise self._not_ready()
        if self._slots >= self.max_inflight:
            return asyncio.ensure_future(self.execute(requests))
        self._slots += 1
        return self._send_batch(requests, on_free)

    def _send_batch(self, requests: Sequence[InferRequest],
                    on_free: Callable[[], None] | None = None) -> asyncio.Future[BatchResult]:
        """Pack and send one Execute; the caller holds a pipeline slot, which the reply frees."""
        try:
            batch_id = next(self._batch_ids)
            packed = self._packer.pack(requests)
        except BaseException:
            self._release_slot()
            raise
        leases, streams = packed.leases, packed.streams
        fut: asyncio.Future[BatchResult] = self._loop.create_future()
        batch = _Batch(batch_id, fut, requests, packed.ids, leases, on_free)
        self._batches[batch_id] = batch
        if streams:
            self._streams.add(streams)
        try:
            header = (codec.execute_header(batch_id, packed.items, packed.forget) if packed.columns is None
                      else codec.execute_columns_header(batch_id, packed.columns, packed.forget))
            self._channel.send(self.identity, [header, *packed.frames])
        except InferdError:
            self._batches.pop(batch_id, None)
            self._release_leases(leases)
            self._streams.end_all(streams)
            self._release_slot()
            raise
        if streams:
            self._streams.attach(streams)
        fut.add_done_callback(functools.partial(self._batch_settled, batch))
        return fut

    def _batch_settled(self, batch: _Batch, fut: asyncio.Future[BatchResult]) -> None:
        # the caller gave up (cancelling the future): tell the worker, whose reply still frees the slot
        if fut.cancelled() and self._batches.get(batch.batch_id) is batch:
            self._send_quiet(m.Cancel(list(batch.ids)))

    def cancel(self, requests: Iterable[InferRequest]) -> None:
        """Tell the worker that these requests (of the batch in flight) are cancelled."""
        wanted = {id(r) for r in requests}
        ids = [rid for batch in self._batches.values()
               for req, rid in zip(batch.requests, batch.ids, strict=False) if id(req) in wanted]
        if self._streams.by_id:
            ids.extend(self._streams.ids_of(wanted, ids))
        if ids:
            self._send_quiet(m.Cancel(ids))

    def _not_ready(self) -> InferdError:
        if self.error is not None:
            return InferdError(ErrorCode.UNAVAILABLE, self.error.message)
        return InferdError(ErrorCode.UNAVAILABLE, f"{self._who()} is {self.state.value}")

    def _on_execute_result(self, msg: dict[str, Any], data: Sequence[Any]) -> None:
        batch_id = msg.get("batch_id")
        batch = self._batches.pop(batch_id, None) if type(batch_id) is int else None
        if batch is None:
            log.warning("%s: unexpected result for batch %r", self._who(), batch_id)
            return
        self._release_leases(batch.leases)
        if batch.on_free is not None and not batch.fut.done():
            try:
                batch.on_free()  # the next batch may leave now, before this one is read
            except Exception:  # a scheduler bug: this batch is still answered
                log.exception("%s: the scheduler failed on a freed slot", self._who())
        try:
            result = codec.batch_result(batch.requests, batch.ids, msg, data, self.model_version, self._outputs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            result = None
            self._kill(f"sent a malformed result ({exc!r})")
            if not batch.fut.done():
                batch.fut.set_exception(
                    InferdError(ErrorCode.INTERNAL, f"{self._who()} sent a malformed result"))
        if result is not None:
            if self._streams.by_id:
                self._streams.end_failed(batch.ids, result.responses)
            if not batch.fut.done():
                batch.fut.set_result(result)
        self._release_slot()

    def _release_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over: the count stays
                return
        self._slots = max(0, self._slots - 1)

    _release_leases = staticmethod(release_leases)

    # ---- messages ----
    def _send(self, msg: Any, frames: Sequence[Any] = ()) -> None:
        self._channel.send(self.identity, m.encode(msg, frames))

    def _send_quiet(self, msg: Any) -> None:
        try:
            self._send(msg)
        except InferdError:
            pass

    def _on_heartbeat(self, frames: list[Any]) -> None:
        self._last_hb = self._loop.time()

    def _on_message(self, frames: list[Any]) -> None:
        try:
            msg, data = codec.parse(frames)
        except m.ProtocolError as exc:
            self._kill(f"sent a malformed message ({exc})")
            return
        cls = type(msg)
        if cls is dict:
            self._on_execute_result(msg, data)
        elif cls is m.StreamResponse:
            self._streams.on_response(msg, data, self.model_version, self._outputs)
        elif cls is m.Log:
            self._log.log(_LOG_LEVELS.get(msg.level, logging.INFO), "%s", msg.message)
        elif cls is m.Bye:
            if msg.error is not None:
                self._log.warning("finalize failed: %s", msg.error.message)
        else:
            fut = self._control.pop(cls, None)
            if fut is None or fut.done():
                self._log.warning("unexpected %s from %s", cls.__name__, self._who())
            else:
                fut.set_result(msg)

    # ---- liveness ----
    async def _heartbeat_loop(self) -> None:
        interval = self._timings.heartbeat_interval_s
        limit = interval * self._timings.heartbeat_misses
        # silence alone is not hang: a model may hold the GIL for seconds in a C call (liveness.py)
        probe = liveness.Probe(self._proc.pid, limit) if self._proc is not None else None
        busy_since: float | None = None
        seq = 0
        while not self._exited.is_set():
            await asyncio.sleep(interval)
            seq += 1
            self._channel.send_heartbeat(self.identity, m.encode(m.Heartbeat(seq)))
            silent = self._loop.time() - self._last_hb
            # while loading, a framework import (torch, onnxruntime: dlopen holds the GIL) may silence
            # the heartbeat thread for seconds; a worker stuck there is caught by the load timeout
            allowed = max(limit, STARTING_SILENCE_S) if self.state is WorkerState.STARTING else limit
            if silent <= allowed:
                if busy_since is not None:
                    log.info("%s answers heartbeats again after %.1f s busy", self._who(),
                             self._loop.time() - busy_since)
                    busy_since = None
                if probe is not None:
                    probe.reset()
                continue
            await self._channel.settle()  # the loop may have been busy: read what is queued first
            silent = self._loop.time() - self._last_hb
            if silent <= allowed:
                continue
            verdict = probe.check(self._loop.time()) if probe is not None else liveness.Verdict.STALLED
            if verdict is liveness.Verdict.STOPPED:
                self._kill(f"hung: no heartbeat for {silent:.1f} s (process stopped)")
                return
            if verdict is liveness.Verdict.STALLED:
                self._kill(f"hung: no heartbeat for {silent:.1f} s and no CPU progress for {limit:g} s")
                return
            if verdict is liveness.Verdict.BUSY and busy_since is None:
                busy_since = self._last_hb
                log.info("%s is busy: no heartbeat for %.1f s but using CPU (a long call holding the "
                         "GIL?); not hung", self._who(), silent)

    def _kill(self, reason: str) -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        if not self._kill_reason:
            self._kill_reason = reason
        try:
            self._proc.kill()
        except ProcessLookupError:
            pass

    async def _watch_exit(self, proc: Any) -> None:
        rc = await proc.wait()
        self.returncode = rc
        if self._stopping:
            err = self.error or InferdError(ErrorCode.UNAVAILABLE, f"{self._who()} was stopped")
        elif self._kill_reason:
            err = InferdError(ErrorCode.UNAVAILABLE, f"{self._who()} {self._kill_reason}; killed")
        else:
            cause = f"{self._who()} died: {describe_exit(rc)}"
            if self.state is WorkerState.STARTING:  # Triton's words first, so that what matches them still does
                cause = (f"Stub process '{self.name}' is not healthy. {self._who()} died during start-up: "
                         f"{describe_exit(rc)}")
            err = InferdError(ErrorCode.UNAVAILABLE, cause)
        was = self.state
        unexpected = not self._stopping
        if self.error is None and unexpected:
            self.error = err
        if unexpected:
            self.state = WorkerState.FAILED
        elif self.state is not WorkerState.FAILED:  # a failed start stays failed
            self.state = WorkerState.STOPPED
        self._fail_all(err)
        self._cleanup()
        if unexpected:
            log.warning("%s", err.message)
            if was in (WorkerState.READY, WorkerState.DRAINING) and self._on_exit is not None:
                self._on_exit(self, err)

    def _fail_all(self, err: InferdError) -> None:
        for fut in self._control.values():
            if not fut.done():
                fut.set_exception(err)
        self._control.clear()
        batches, self._batches = self._batches, {}
        for batch in batches.values():
            self._release_leases(batch.leases)
            if not batch.fut.done():
                batch.fut.set_exception(err)
        self._streams.fail_all(err)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # it re-checks the state and raises
        self._slots = 0

    def _cleanup(self) -> None:
        self._outputs.close()
        if self._proc is not None and self._proc.returncode is not None and not getattr(self._proc, "external", False):
            shm.unlink_owned(self._proc.pid)  # regions a dead worker created (its output/BLS arenas)
        self._channel.unregister(self.identity)
        if self._hb_task is not None and self._hb_task is not asyncio.current_task():
            self._hb_task.cancel()
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
        self._exited.set()

    # ---- shutdown ----
    async def stop(self, timeout: float | None = None) -> None:
        """Shutdown → Bye → exit within `timeout` (default stop_timeout_s), else SIGKILL. Always reaped."""
        if self._proc is None:
            self.state = WorkerState.STOPPED
            return
        if self._exited.is_set():
            return
        timeout = self._timings.stop_timeout_s if timeout is None else timeout
        self._stopping = True
        if self.state in (WorkerState.READY, WorkerState.STARTING):
            self.state = WorkerState.DRAINING
        if self.hello is None:
            self._kill("stopped before start-up completed")
        else:
            try:
                self._send(m.Shutdown())
            except InferdError:
                self._kill("not reachable for Shutdown")
        try:
            await asyncio.wait_for(self._exited.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("%s did not exit within %g s of Shutdown; killing it", self._who(), timeout)
            self._kill("did not exit after Shutdown")
        await asyncio.shield(self._reap())

    def kill(self, reason: str = "killed by the supervisor") -> None:
        """SIGKILL now (as an unrequested death: in-flight requests fail, on_exit is told)."""
        self._kill(reason)
