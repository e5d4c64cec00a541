"""The worker's message loop: one handler per message type (a type -> handler table; nothing the
peer sends is ever used to pick a function by name).

State: no model -> (AutoComplete answered any time) -> model loaded -> Shutdown -> Bye.
One Execute at a time; Cancel messages that arrive during an Execute are picked up when the model
asks `request.is_cancelled()` (the main socket is read ahead; other messages stay queued).

Decoupled models: their execute runs beside the main thread's reading (decoupled_serving.py).

Direct peers (frontend processes, after an Attach: direct_peers.py): while none is attached the loop reads
the main socket alone, exactly as before; with peers it serves every socket, and a peer's message is handled
with that peer as the origin (its Cancels, its reply socket, the output regions handed to it).
"""

from __future__ import annotations

import gc
import itertools
import json
import select
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from . import backends, columns, direct_serving, log_levels, tensors
from .backends.base import Backend, ModelSpec, Request, Response, Tensor, WorkerContext, requests_by_columns
from .channel import Channel
from .decoupled_serving import DecoupledServing
from .direct_peers import DirectPeers
from .direct_serving import DirectServing
from .merged_serving import MergedServing, prune
from .outbox import Outbox
from .result_writer import ResultWriter, wire_error
from .wire.errors import ErrorCode, InferdError
from .wire.messages import (
    Attach,
    AutoComplete,
    AutoCompleteResult,
    Bye,
    Cancel,
    Execute,
    ExecuteColumns,
    Heartbeat,
    LoadModel,
    LoadResult,
    LogSettings,
    ProtocolError,
    ReleaseOutputs,
    Shutdown,
    WireError,
)

_now_ns = time.perf_counter_ns
_input_tensors = tensors.input_tensors
_frame_buffers = tensors.frame_buffers
_requests_by_columns = requests_by_columns


def _reshaped(tensor: Tensor, reshapes: dict[str, tuple[bool, list[int]]]) -> Tensor:
    rule = reshapes.get(tensor.name)
    if rule is None:
        return tensor
    return Tensor(tensor.name, tensor.datatype, tensors.reshape_input(tensor.array, tensor.name, *rule))

_INT, _STR = frozenset((int,)), frozenset((str,))
_EXECUTES = frozenset((Execute, ExecuteColumns))  # (the messages whose poll_us asks the worker to poll next)
_NO_IDS = itertools.repeat("")  # the client ids of a batch sent without any
_CANCELLED = WireError(code=int(ErrorCode.CANCELLED), message="request cancelled")


def settle_heap() -> None:
    """After the model is loaded: what exists now (the interpreter, numpy, the model and its framework)
    lives as long as the worker, so keep it out of the collector's full passes, which scan every tracked
    object (~15 ms with numpy and pyzmq alone, longer with a framework: a stall in the middle of a batch).
    A batch of 32 requests allocates several hundred tracked objects, so the default young-generation
    threshold of 700 collected about once per batch; requests die by reference counting first at 10000."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


class Runtime(DirectServing, MergedServing, DecoupledServing):
    def __init__(
        self, channel: Channel, log_verbose: int = 0, log: Optional[Callable[[str], None]] = None,
        metrics: Optional[Callable[[], None]] = None,
        backend_factory: Optional[Callable[[str], Backend]] = None, polls: bool = True,
        readiness: Optional[Callable[[Callable[[], bool]], Any]] = None,
    ) -> None:
        """`polls`: an Execute's poll_us is honoured (False for a worker thread hosted in the API user's
        process, pytriton/host.py: its polling would take the interpreter from the user's threads).
        `readiness(check)`: starts the `<identity>/ready` socket's thread (readiness.py) for a model that
        defines is_ready(), returning something with `stop()`; None: such checks are not offered."""
        self._channel = channel
        self._polls = polls
        # sends the custom metrics' changes before an answer leaves (worker/metrics_sender.py)
        self._flush_metrics = metrics or (lambda: None)
        # the Python API (inferd.pytriton) runs Runtimes in its user's process, with backends of its own;
        # the process is the user's, so its collector settings are left alone (settle_heap)
        self._create_backend = backend_factory or backends.create
        self._owns_process = backend_factory is None
        self._log = log or (lambda message: None)
        self._cache = tensors.ShmCache()
        self._results = ResultWriter(self._log)  # the answers: outputs checked, placed and written
        self._backend: Optional[Backend] = None
        self._spec: Optional[ModelSpec] = None
        self._reshapes: dict[str, tuple[bool, list[int]]] = {}  # inputs the config reshapes
        # Cancels of the origin whose message is being handled (the main socket's set, or a direct peer's
        # while its message is: request ids are chosen per sender); changed in place, never rebound
        self._cancelled: set[int] = set()
        self._main_cancelled = self._cancelled
        self._reply: Any = channel  # where the batch being handled is answered (the origin's socket)
        self._peers: Optional[DirectPeers] = None  # made by the first Attach
        self._main_thread = threading.current_thread()
        self._is_cancelled: Callable[[int], bool] = self.is_cancelled  # one bound method, handed to every Request
        self._context = WorkerContext(log_verbose=log_verbose, cancelled=self.is_cancelled,
                                      poll=self.poll_cancellations, emit=self._emit,
                                      hold_emits=self._hold_emits, release_emits=self._release_emits)
        # decoupled models only (set at load): see the module docstring
        self._outbox: Optional[Outbox] = None
        self._execute_thread: Optional[ThreadPoolExecutor] = None
        self._poller: Optional[Any] = None  # select.poll of the socket and the Outbox's pipe
        self._open: set[int] = set()  # decoupled requests that have not ended
        self._open_lock = threading.Lock()  # guards _open, _fast_streak and _queued_batches too
        self._fast_streak = 0  # decoupled: executes in a row that took under INLINE_MAX_NS
        self._queued_batches = 0  # decoupled: batches handed to the execute thread, not yet run
        self._inline_active = False  # decoupled: an execute runs on the main thread (it reads no socket)
        self._inline_reader = threading.Lock()  # held while a thread reads Cancels for it, and to end it
        self._open_readiness = readiness
        self._readiness: Any = None  # the model's is_ready() responder, while the model is loaded
        self._init_merged()  # merged_serving.py: with peers, batches from several senders run as one
        self._running = True
        self._single = True  # running, with no direct peer: the main socket's loop (run)
        self.bye_error: Optional[WireError] = None
        self._handlers: dict[type[Any], Callable[[Any, Sequence[Any]], None]] = {
            AutoComplete: self._on_auto_complete,
            LoadModel: self._on_load,
            Execute: self._on_execute,
            ExecuteColumns: self._on_execute_columns,
            Cancel: self._on_cancel,
            ReleaseOutputs: self._on_release_outputs,
            Shutdown: self._on_shutdown,
            Heartbeat: self._on_heartbeat,
            LogSettings: self._on_log_settings,
            Attach: self._on_attach,
        }

    # ---- loop -----------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until Shutdown. Raises ProtocolError on a malformed or unexpected message (from the main
        socket: a direct peer's only drops that peer)."""
        try:
            while self._running:
                if self._peers is not None and len(self._peers):
                    self._run_direct(self._peers)
                else:
                    self._single = True
                    self._run_single()
        finally:
            if self._peers is not None:
                self._peers.close()

    def _run_single(self) -> None:
        """The main socket alone (no direct peer): until Shutdown or an Attach."""
        while self._single:
            message, frames = self._channel.recv() if self._outbox is None else self._recv_streaming()
            handler = self._handlers.get(type(message))
            if handler is None:
                raise ProtocolError("unexpected message type %s from the supervisor" % type(message).__name__)
            handler(message, frames)
            if type(message) in _EXECUTES and message.poll_us and self._polls and self._outbox is None:
                poll_us = message.poll_us
                if type(poll_us) is not int:
                    raise ProtocolError("malformed poll_us %r in an Execute" % (poll_us,))
                self._channel.poll_next(poll_us)  # answered: the next request is expected soon

    def is_cancelled(self, request_id: int) -> bool:
        """Cancellation probe for backends; on the main thread it first reads pending Cancels."""
        if threading.current_thread() is self._main_thread:
            self.poll_cancellations()
        elif self._inline_active:
            self._read_cancels_inline()
        return request_id in self._cancelled

    def poll_cancellations(self) -> None:
        """Main thread only: take Cancel messages already waiting on the socket (others stay queued).
        Decoupled models: their main thread reads every message as it comes, unless it is running an execute."""
        if self._outbox is not None or threading.current_thread() is not self._main_thread:
            if self._inline_active:
                self._read_cancels_inline()
            return
        got = self._channel.read_ahead()
        if any(isinstance(message, Cancel) for message, _ in got):
            for message, _ in got:
                if isinstance(message, Cancel):
                    self._main_cancelled.update(message.request_ids)
            self._channel.take_pending(lambda msg: not isinstance(msg, Cancel))
        if self._peers is not None and len(self._peers):
            self._peers.read_cancels()

    # ---- handlers -------------------------------------------------------------------------------

    def _on_heartbeat(self, message: Heartbeat, frames: Sequence[Any]) -> None:
        pass  # heartbeats belong on the heartbeat socket; tolerated here

    def _on_log_settings(self, message: LogSettings, frames: Sequence[Any]) -> None:
        if type(message.verbose) is not int or not all(
                type(v) is bool for v in (message.info, message.warning, message.errors)):
            raise ProtocolError("malformed log_settings message")
        log_levels.update(message.verbose, message.info, message.warning, message.errors)
        self._context.log_verbose = message.verbose  # a model loaded after this starts with it

    def _on_cancel(self, message: Cancel, frames: Sequence[Any]) -> None:
        if self._outbox is None:
            self._cancelled.update(message.request_ids)
            return
        with self._open_lock:  # only requests still open: a late Cancel must not linger
            self._cancelled.update(rid for rid in message.request_ids if rid in self._open)

    def _on_release_outputs(self, message: ReleaseOutputs, frames: Sequence[Any]) -> None:
        regions = message.regions
        if self._peers is not None and len(self._peers):  # regions a direct peer holds are that peer's to give
            regions = self._peers.not_held(regions)
        self._results.release(regions, message.device)

    def _on_auto_complete(self, message: AutoComplete, frames: Sequence[Any]) -> None:
        try:
            backend = backends.create(message.backend)
            spec = ModelSpec(message.model_name, message.model_dir, message.version, message.config_json,
                             message.backend, backend_dir=message.backend_dir)
            if getattr(backend, "supports_auto_complete", False):
                completed = backend.auto_complete(spec, dict(spec.config))
            else:
                completed = spec.config
            reply = AutoCompleteResult(config_json=json.dumps(completed))
        except Exception as exc:
            reply = AutoCompleteResult(error=wire_error(exc))
        self._channel.send(reply)

    def _on_load(self, message: LoadModel, frames: Sequence[Any]) -> None:
        if self._backend is not None:
            self._channel.send(LoadResult(error=WireError(int(ErrorCode.ALREADY_EXISTS),
                                                          "a model is already loaded in this worker")))
            return
        try:
            spec = ModelSpec(message.model_name, message.model_dir, message.version, message.config_json,
                             message.backend, message.instance_name, message.instance_kind, message.device_id,
                             message.backend_dir)
            backend = self._create_backend(message.backend)
            # its device is current before initialize (main thread), unless the backend places its work itself
            if spec.instance_kind == "GPU" and not getattr(backend, "owns_device", False):
                from . import current_device

                current_device.make_current_or_warn(spec.device_id, spec.instance_name)
            backend.load(spec, self._context)
        except Exception as exc:
            self._channel.send(LoadResult(error=wire_error(exc)))
            return
        self._backend, self._spec = backend, spec
        self._cache.device_inputs = bool(getattr(backend, "device_inputs", False))
        self._results.configure(spec, bool(getattr(backend, "checks_outputs", True)))
        self._reshapes = tensors.input_reshapes(spec.config)
        max_batch = spec.config.get("max_batch_size")
        if ("dynamic_batching" in spec.config and type(max_batch) is int and max_batch > 1 and not spec.decoupled
                and direct_serving.any_requests_batch(spec.config)):
            self._merge_max = max_batch
        if spec.decoupled:
            # model threads send their responses themselves while the socket is free (a Channel's send lock)
            self._outbox = Outbox(self._channel if isinstance(self._channel, Channel) else None)
            self._execute_thread = ThreadPoolExecutor(1, thread_name_prefix="inferd-execute",
                                                      initializer=self._execute_thread_start)
            self._poller = select.poll()  # (POLLHUP and POLLERR end a wait too: the read then tells)
            self._poller.register(self._channel.fileno(), select.POLLIN)
            self._poller.register(self._outbox.fileno(), select.POLLIN)
            if self._peers is not None:
                self._peers.watch(self._outbox.fileno(), self._flush_outbox)
        if self._owns_process:
            settle_heap()
        # is_ready() defined: its socket opens before the load is answered (the supervisor may probe at once)
        check = backend.readiness_check() if hasattr(backend, "readiness_check") else None
        if check is not None and self._open_readiness is not None:
            self._readiness = self._open_readiness(check)
        self._flush_metrics()  # what initialize made is on /metrics once the load is answered
        self._channel.send(LoadResult(backend=backend.name, readiness=self._readiness is not None))

    def _execute_thread_start(self) -> None:
        """The CUDA device is per thread: a GPU instance's execute thread gets it too."""
        spec = self._spec
        if spec is not None and spec.instance_kind == "GPU" and not getattr(self._backend, "owns_device", False):
            from . import current_device

            current_device.make_current_or_warn(spec.device_id, spec.instance_name)

    def release(self) -> None:
        """Unmap the input regions and free the output arena. Shutdown does it; a runtime that ends
        otherwise in a process that lives on (the Python API's host after the server died) calls it."""
        self._cache.close()
        self._results.close()

    def stop_readiness(self) -> None:
        """Close the is_ready() socket (Shutdown does, before finalize; the worker's exit too)."""
        if self._readiness is not None:
            self._readiness.stop()
            self._readiness = None

    def _on_shutdown(self, message: Shutdown, frames: Sequence[Any]) -> None:
        error = None
        self.stop_readiness()  # no is_ready() once finalize may run
        backend, self._backend = self._backend, None
        if self._execute_thread is not None:
            self._execute_thread.shutdown(wait=True)  # batches already received finish first
        self._stop_merging()  # (the direct loop waited for its batch before this message)
        if backend is not None:
            try:
                failed = backend.unload()
                error = wire_error(failed) if failed is not None else None
            except Exception as exc:
                error = wire_error(exc)
        if self._outbox is not None:
            self._outbox.stop_direct()  # posted from now on: queued (this flush sends it; Bye is the last message)
            self._outbox.flush(self._channel)
        self.release()
        self.bye_error = error
        self._channel.send(Bye(error=error))
        self._running = self._single = False

    def _on_execute(self, message: Execute, frames: Sequence[Any]) -> None:
        t0 = _now_ns()
        if message.forget_regions:
            self._cache.forget(message.forget_regions)
        cache = self._cache
        probe = self._is_cancelled
        frames = _frame_buffers(frames)
        entries: list[Any] = []  # per request: its Request, or (request_id, WireError) for a failed one
        runnable: list[Request] = []
        cancelled = self._cancelled  # Cancels read ahead while an earlier batch ran
        reshapes = self._reshapes
        for item in message.requests:
            if cancelled and item.request_id in cancelled:  # cancelled before it started: never run it
                entries.append((item.request_id, _CANCELLED))
                continue
            try:
                inputs = _input_tensors(item.inputs, frames, cache, Tensor)
                if reshapes:
                    inputs = [_reshaped(t, reshapes) for t in inputs]
            except Exception as exc:
                entries.append((item.request_id, wire_error(exc)))
                continue
            request = Request(  # the decoded item is ours alone: its lists need no copy
                item.request_id, item.id, inputs, item.requested_outputs, item.parameters,
                item.correlation_id, item.flags, item.timeout_us, probe,
            )
            if item.device_outputs:
                request.device_outputs = True
            if item.trace:
                request.trace = item.trace
            entries.append(request)
            runnable.append(request)
        last = message.requests[-1].request_id if message.requests else None
        self._run_entries(message.batch_id, entries, runnable, t0, last)

    def _on_execute_columns(self, message: ExecuteColumns, frames: Sequence[Any]) -> None:
        """An Execute sent by columns: each request's inputs are rows of the columns' arrays."""
        t0 = _now_ns()
        if message.forget_regions:
            self._cache.forget(message.forget_regions)
        request_ids, ids, wanted = message.request_ids, message.ids, message.requested_outputs
        count = len(request_ids)
        # (the element types by set(map(type, ...)): no generator frame per element)
        if not (type(request_ids) is list and set(map(type, request_ids)) <= _INT
                and type(ids) is list and len(ids) in (0, count) and set(map(type, ids)) <= _STR
                and type(wanted) is list and set(map(type, wanted)) <= _STR):
            raise ProtocolError("malformed execute_columns message")
        entries: list[Any] = []
        runnable: list[Request] = []
        try:
            arrays = columns.input_columns(message.inputs, tensors.frame_buffers(frames), count)
        except Exception as exc:
            error = wire_error(exc)
            entries = [(rid, error) for rid in request_ids]
            self._run_entries(message.batch_id, entries, runnable, t0, request_ids[-1] if count else None)
            return
        probe = self._is_cancelled
        cancelled = self._cancelled
        reshapes = self._reshapes
        # `list(array)` makes the row views in C
        if not cancelled and not reshapes:  # the usual batch: every request runs, as it came
            # every request shares the list of wanted outputs: backends only read it
            runnable = _requests_by_columns(
                request_ids, ids or _NO_IDS,
                [(column.name, column.datatype, list(array)) for column, array in zip(message.inputs, arrays)],
                wanted, probe)
            self._run_entries(message.batch_id, runnable, runnable, t0, request_ids[-1] if count else None)
            return
        # per request its inputs, built column by column: a comprehension over the columns per request
        # cost more than the rows themselves
        per_request: list[list[Tensor]] = [[] for _ in range(count)]
        for column, array in zip(message.inputs, arrays):
            name, datatype = column.name, column.datatype
            for inputs, row in zip(per_request, list(array)):  # a loop, not a comprehension: no call
                inputs.append(Tensor(name, datatype, row))
        for i, rid in enumerate(request_ids):
            if cancelled and rid in cancelled:
                entries.append((rid, _CANCELLED))
                continue
            inputs = per_request[i]
            if reshapes:
                try:
                    inputs = [_reshaped(t, reshapes) for t in inputs]
                except Exception as exc:
                    entries.append((rid, wire_error(exc)))
                    continue
            # every request shares the list of wanted outputs: backends only read it
            request = Request(rid, ids[i] if ids else "", inputs, wanted, "{}", 0, 0, 0, probe)
            entries.append(request)
            runnable.append(request)
        self._run_entries(message.batch_id, entries, runnable, t0, request_ids[-1] if count else None)

    def _run_entries(self, batch_id: int, entries: list[Any], runnable: list[Request], t0: int,
                     last_request_id: Optional[int]) -> None:
        """Run a decoded batch and answer it (decoupled models: on the execute thread)."""
        t1 = _now_ns()
        if self._execute_thread is not None:
            self._run_streaming(self._execute_thread, batch_id, entries, runnable, t0, t1)
            return
        backend = self._backend  # _execute and _run_backend inline: the path of every batch
        if backend is not None and runnable:
            try:
                results = backend.execute(runnable)
                if len(results) != len(runnable):
                    raise InferdError(ErrorCode.INTERNAL, "backend returned %d responses for %d requests"
                                      % (len(results), len(runnable)))
            except Exception as exc:
                results = self._backend_failed(exc, runnable)
        else:
            results = self._run_backend(runnable)
        header, out_frames = self._results.batch(batch_id, entries, runnable, results, (t0, t1, _now_ns()))
        self._flush_metrics()
        self._reply.send_encoded(header, out_frames)  # (the main socket, or the direct peer that sent it)
        if self._cancelled and last_request_id is not None:
            prune(self._cancelled, last_request_id)

    def _execute(self, batch_id: int, entries: list[Any], runnable: list[Request], t0: int, t1: int,
                 failed: Optional[list[int]] = None) -> tuple[bytes, list[Any]]:
        """(ExecuteResult header, data frames) of one batch; ids of the requests answered with an
        error are added to `failed` if given."""
        results = self._run_backend(runnable)
        return self._results.batch(batch_id, entries, runnable, results, (t0, t1, _now_ns()), failed)

    # ---- helpers --------------------------------------------------------------------------------

    def _run_backend(self, requests: list[Request]) -> Sequence[Response]:
        if not requests:
            return []
        backend = self._backend
        if backend is None:
            error = InferdError(ErrorCode.UNAVAILABLE, "no model is loaded in this worker")
            return [Response(error=error) for _ in requests]
        try:
            results = backend.execute(requests)
            if len(results) != len(requests):
                raise InferdError(ErrorCode.INTERNAL, "backend returned %d responses for %d requests"
                                  % (len(results), len(requests)))
            return results
        except Exception as exc:
            return self._backend_failed(exc, requests)

    def _backend_failed(self, exc: Exception, requests: list[Request]) -> list[Response]:
        """Every request of a batch whose backend raised answered with the error."""
        error = exc if isinstance(exc, InferdError) else InferdError(
            ErrorCode.INTERNAL, "%s: %s" % (type(exc).__name__, exc))
        self._log("execute failed in the backend: %s" % error.message)
        return [Response(error=error) for _ in requests]
