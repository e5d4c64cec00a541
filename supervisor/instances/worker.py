"""One live worker process and the supervisor's side of its protocol (docs/worker-protocol.md).

State machine: starting → ready → draining → stopped | failed. Death is detected by awaiting the
process exit (a per-child wait); a heartbeat watchdog (liveness.py) SIGKILLs a worker that went silent
and is stopped (SIGSTOP) or makes no CPU progress (deadlocked), so that it takes the same path; a silent
worker that uses CPU is busy (a long C call holding the GIL), not hung. On any exit that was
not requested, every request in flight fails at once with UNAVAILABLE naming the instance, its pid
and the cause, and `on_exit` is told.

The batches in flight (pipeline slots, results matched to batches) are pipeline.py's; decoupled
requests stay open after their batch's ExecuteResult until their final StreamResponse, in streams.py.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from inferd.supervisor import logs
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.inference.types import InferRequest
from inferd.worker.wire import messages as m
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

from . import cgroup_memory, liveness, memory_cap, readiness, results
from .channel import Channel
from .external import ExternalLauncher
from .launcher import Bootstrap, Launcher
from .outputs import WorkerOutputs
from .packing import InputPacker
from .pipeline import BatchPipeline
from .results import BatchResult

log = logging.getLogger("inferd.instances.worker")

_identities = itertools.count(1)
# set by the frontend processes (frontend_processes/): awaited with a worker's identity before its Shutdown, so
# that requests the frontends sent it straight are answered first
BEFORE_STOP: Callable[[str], Awaitable[None]] | None = None
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


# why a worker ended, as the restart metric counts it (recycled: a rolling replacement asked for)
EXIT_REASONS = ("exit", "signal", "hung", "memory", "recycled")


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        text = f"killed by signal {-returncode} ({name})"
        if returncode == -signal.SIGKILL:  # not sent by us (ours name their reason): the usual sender is the OOM killer
            text += ", possibly by the kernel's OOM killer"
        return text
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
        # the model defines is_ready() (LoadResult.readiness): readiness requests ask it (readiness.py)
        self.readiness: readiness.WorkerReadiness | None = None
        self._channel = channel
        self._launcher = launcher
        self._timings = timings
        self._python = python
        self._extra_env = extra_env
        self._path_prefix = tuple(path_prefix)
        self._log_verbose = log_verbose
        self._on_exit = on_exit
        self._device = device
        self._loop = asyncio.get_running_loop()
        # an asyncio process, or an external.ExternalProcess (a worker hosted by the API user's process)
        self._proc: Any = None
        self._exited = asyncio.Event()
        self._exit_task: asyncio.Task[None] | None = None
        self._hb_task: asyncio.Task[None] | None = None
        self._watchdog: liveness.Watchdog | None = None  # from Hello on
        self._control: dict[type, asyncio.Future[Any]] = {}
        self._stopping = False
        self._kill_reason = ""
        self._kill_cause = ""  # the EXIT_REASONS entry of a kill of ours
        self.exit_reason = ""  # why an unrequested exit happened (EXIT_REASONS), set when it is seen
        self.memory_limit = timings.memory_limit_bytes  # bytes; None: no cap
        self._rss: memory_cap.RssWatch | None = None  # the watchdog's looks, where no cgroup holds the cap
        self._cgroup: cgroup_memory.WorkerGroup | None = None
        # large outputs the worker wrote into its own regions; their names go back once collected
        self._outputs = WorkerOutputs(lambda names: self._send_quiet(m.ReleaseOutputs(names)), self.identity, name,
                                      lambda keys: self._send_quiet(m.ReleaseOutputs([], keys)))
        self._pipeline = BatchPipeline(
            depth=timings.pipeline_depth, packer=InputPacker(pool, device), outputs=self._outputs,
            model_version=model_version, send=lambda frames, hold: channel.send(self.identity, frames, hold),
            send_quiet=self._send_quiet, kill=self._kill, refusal=self._refusal, who=self._who)
        self.launch = self._pipeline.launch  # the schedulers' path: no extra call per batch
        self._log = logging.getLogger(f"inferd.worker.{name}")

    # ---- introspection ----
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def max_inflight(self) -> int:
        """Batches sent ahead to this worker (pipeline_depth)."""
        return self._pipeline.depth

    @max_inflight.setter
    def max_inflight(self, depth: int) -> None:
        self._pipeline.depth = max(1, depth)

    @property
    def busy(self) -> bool:
        return self._pipeline.busy

    @property
    def inflight(self) -> int:
        return self._pipeline.inflight

    @property
    def held(self) -> int:
        """Batches and streams this worker still has to answer (BatchPipeline.held)."""
        return self._pipeline.held

    @property
    def open_streams(self) -> int:
        """Decoupled requests that have not received their final response."""
        return len(self._pipeline.streams)

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
            if self._rss is not None and self._rss.over():  # initialize() alone took it past its cap
                self.exit_reason = "memory"
                raise InferdError(ErrorCode.UNAVAILABLE, memory_cap.exceeded(
                    self.model_name, self.name, self._rss.cap, self._rss.last, " after loading the model"))
            if result.readiness is True:
                self.readiness = readiness.for_worker(self._channel, self.identity)
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
        readiness.listen(self._channel)  # a model's is_ready() socket may greet before its LoadResult
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
        if self.memory_limit is not None and not getattr(self._proc, "external", False):
            self._cap_memory(self._proc.pid, self.memory_limit)
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
        self._watchdog = liveness.Watchdog(
            pid=self._proc.pid, interval_s=t.heartbeat_interval_s, misses=t.heartbeat_misses,
            starting_silence_s=STARTING_SILENCE_S,
            ping=lambda seq: self._channel.send_heartbeat(self.identity, m.encode(m.Heartbeat(seq))),
            settle=self._channel.settle, starting=lambda: self.state is WorkerState.STARTING,
            kill=lambda reason: self._kill(reason, "hung"), who=self._who,
            tick=self.check_memory if self._rss is not None else None, working=self._working)
        self._hb_task = self._loop.create_task(self._watchdog.run(self._exited), name="hb-" + self.name)

    def _working(self) -> bool:
        """Whether the worker has something to answer (a batch, a stream, a control message) or is not
        plainly ready: the watchdog then pings it every interval; an idle worker is left to sleep."""
        return self._pipeline.held > 0 or bool(self._control) or self.state is not WorkerState.READY

    # ---- memory cap (memory_cap.py, cgroup_memory.py) ----
    def _cap_memory(self, pid: int, cap: int) -> None:
        parent = cgroup_memory.parent()
        if parent is not None:
            self._cgroup = parent.worker_group(f"inferd-{os.getpid()}-{self.identity}", cap, pid)
        if self._cgroup is None:
            self._rss = memory_cap.RssWatch(pid, cap)
            if self._device is None:
                memory_cap.set_rlimit_data(pid, cap)

    def check_memory(self) -> None:
        """The RSS watchdog's look (after each answered batch, on each heartbeat tick): over the cap, killed."""
        watch = self._rss
        if watch is not None and self._proc is not None and self._proc.returncode is None and watch.over():
            self._kill(memory_cap.exceeded(self.model_name, self.name, watch.cap, watch.last), "memory")

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

    # ---- execution (pipeline.py) ----
    async def execute(self, requests: Sequence[InferRequest]) -> BatchResult:
        """Run one batch. Up to pipeline_depth Executes are in flight per worker; callers queue (FIFO).

        Raises InferdError(UNAVAILABLE) when the worker is not ready or dies meanwhile. Cancelling the
        caller sends Cancel to the worker; the batch still occupies the worker until its reply.
        `launch(requests)` is the same without a coroutine while a slot is free (the schedulers' path).
        """
        return await self._pipeline.execute(requests)

    async def check_ready(self) -> readiness.Answer:
        """The model's is_ready() answer (True at once for a model without one); False while not READY."""
        if self.state is not WorkerState.READY:
            return False, f"{self._who()} is {self.state.value}"
        if self.readiness is None:
            return True, ""
        return await self.readiness.check()

    def cancel(self, requests: Iterable[InferRequest]) -> None:
        """Tell the worker that these requests (of the batch in flight) are cancelled."""
        self._pipeline.cancel(requests)

    def _refusal(self) -> InferdError | None:
        if self.state is WorkerState.READY:
            return None
        if self.error is not None:
            return InferdError(ErrorCode.UNAVAILABLE, self.error.message)
        return InferdError(ErrorCode.UNAVAILABLE, f"{self._who()} is {self.state.value}")

    def attach(self, endpoint: str) -> None:
        """Tell the worker to connect to a frontend process's listener (the direct path, issue 42)."""
        if self.state is WorkerState.READY:
            self._send_quiet(m.Attach(endpoint))

    # ---- messages ----
    def _send(self, msg: Any, frames: Sequence[Any] = ()) -> None:
        self._channel.send(self.identity, m.encode(msg, frames))

    def _send_quiet(self, msg: Any) -> None:
        try:
            self._send(msg)
        except InferdError:
            pass

    def _on_heartbeat(self, frames: list[Any]) -> None:
        if self._watchdog is not None:
            self._watchdog.heard()

    def _on_message(self, frames: list[Any]) -> None:
        try:
            msg, data = results.read(frames)
        except m.ProtocolError as exc:
            self._kill(f"sent a malformed message ({exc})")
            return
        cls = type(msg)
        if cls is results.PlainResult or cls is m.ExecuteResult or cls is m.ExecuteResultColumns:
            self._pipeline.on_result(msg, data)
            if self._rss is not None and self._rss.due():  # its batch has answered: over the cap now, no more
                self.check_memory()
        elif cls is m.StreamResponse:
            self._pipeline.on_stream_response(msg, data)
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

    def _kill(self, reason: str, cause: str = "signal") -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        if not self._kill_reason:
            self._kill_reason = reason
            self._kill_cause = cause
        try:
            self._proc.kill()
        except ProcessLookupError:
            pass

    async def _watch_exit(self, proc: Any) -> None:
        rc = await proc.wait()
        self.returncode = rc
        if self._stopping:
            err = self.error or InferdError(ErrorCode.UNAVAILABLE, f"{self._who()} was stopped")
        elif self._kill_cause == "memory":
            err = InferdError(ErrorCode.UNAVAILABLE, f"{self._kill_reason}; killed (pid {proc.pid})")
            self.exit_reason = "memory"
        elif self._kill_reason:
            err = InferdError(ErrorCode.UNAVAILABLE, f"{self._who()} {self._kill_reason}; killed")
            self.exit_reason = self._kill_cause
        elif self._cgroup is not None and self.memory_limit is not None and self._cgroup.oom_kills():
            err = InferdError(ErrorCode.UNAVAILABLE, memory_cap.exceeded(
                self.model_name, self.name, self.memory_limit, None,
                f"; killed by the kernel's OOM killer in its cgroup (pid {proc.pid})"))
            self.exit_reason = "memory"
        else:
            self.exit_reason = "signal" if rc < 0 else "exit"
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
        self._pipeline.fail_all(err)

    def _cleanup(self) -> None:
        self._outputs.close()
        if self._proc is not None and self._proc.returncode is not None and not getattr(self._proc, "external", False):
            shm.unlink_owned(self._proc.pid)  # regions a dead worker created (its output/BLS arenas)
            if self._cgroup is not None:
                self._cgroup.remove()
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
            if BEFORE_STOP is not None:  # frontends answer what they sent it straight first (direct path)
                try:
                    await BEFORE_STOP(self.identity)
                except Exception:
                    log.exception("waiting for the frontend processes before stopping %s failed", self._who())
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
