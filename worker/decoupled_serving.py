"""The message loop's decoupled models (a mixin of message_loop.Runtime; docs/worker-protocol.md "Decoupled
models"). The attributes below are Runtime's.

Their execute runs on one execute thread (batches in arrival order) while the main thread keeps the socket:
it reads Cancels at once (the model may be streaming from its own threads) and sends what other threads
posted to the Outbox (StreamResponses, then each batch's ExecuteResult, in the order they were posted) when
they could not send it themselves (channel.py: a posting thread writes its message while nothing is queued
before it and the socket is free). A request stays open from its Execute until its final response.

A model whose execute() returns at once (it hands the requests to threads or an engine, as LLM models do) is
run on the main thread instead, once its last INLINE_AFTER executes each took under INLINE_MAX_NS and none
waits on the execute thread: the hand-off to that thread is a wake-up on every request's way in. One that then
takes INLINE_MAX_NS or more goes back to the thread. While an execute runs on the main thread,
`is_cancelled()` from any thread reads the Cancels waiting on the socket itself (one reader at a time), so a
model that waits in execute for a cancellation still sees it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from .backends.base import Request, Response
from .channel import Channel
from .outbox import Outbox
from .result_writer import ResultWriter, wire_error
from .wire.errors import ErrorCode, InferdError
from .wire.messages import Cancel

# a decoupled model runs on the main thread after this many executes in a row each under INLINE_MAX_NS
INLINE_AFTER = 4
INLINE_MAX_NS = 1_000_000
_now_ns = time.perf_counter_ns


class DecoupledServing:
    _channel: Channel
    _outbox: Optional[Outbox]
    _poller: Optional[Any]
    _results: ResultWriter
    _open: set[int]
    _open_lock: threading.Lock
    _fast_streak: int
    _queued_batches: int
    _inline_active: bool
    _inline_reader: threading.Lock
    _cancelled: set[int]
    _log: Callable[[str], None]
    _flush_metrics: Callable[[], None]

    def _on_cancel(self, message: Cancel, frames: Sequence[Any]) -> None:
        raise NotImplementedError

    def _execute(self, batch_id: int, entries: list[Any], runnable: list[Request], t0: int, t1: int,
                 failed: Optional[list[int]] = None) -> tuple[bytes, list[Any]]:
        raise NotImplementedError

    def _recv_streaming(self) -> tuple[Any, Sequence[Any]]:
        """Next message, sending what the Outbox holds meanwhile (decoupled models). The Outbox is flushed
        when its pipe says something was queued (a message queued while one waits has its wake-up byte
        pending: channel.py), so a wake-up for a message from the supervisor goes straight to reading it."""
        outbox, channel, poller = self._outbox, self._channel, self._poller
        assert outbox is not None and poller is not None
        pipe = outbox.fileno()
        while True:
            got = channel.recv_nowait()
            if got is not None:
                return got
            for fd, _ in poller.poll():  # the socket, or a wake-up from a thread that posted
                if fd == pipe:
                    outbox.flush(channel)

    def _read_cancels_inline(self) -> None:
        """Any thread, while the main thread runs a decoupled execute: take the Cancels waiting on the main
        socket (the rest stays queued for the main loop)."""
        with self._inline_reader:
            if not self._inline_active:
                return
            got = self._channel.read_ahead()
            if any(isinstance(message, Cancel) for message, _ in got):
                for message, frames in got:
                    if isinstance(message, Cancel):
                        self._on_cancel(message, frames)
                self._channel.take_pending(lambda msg: not isinstance(msg, Cancel))

    def _run_streaming(self, execute_thread: ThreadPoolExecutor, batch_id: int, entries: list[Any],
                       runnable: list[Request], t0: int, t1: int) -> None:
        """A decoded batch of a decoupled model: run on the execute thread, or here when its executes return at
        once; its requests stay open until their final responses."""
        with self._open_lock:
            self._open.update(r.request_id for r in runnable)
            inline = self._fast_streak >= INLINE_AFTER and not self._queued_batches
            if not inline:
                self._queued_batches += 1
        if inline:  # (nothing waits on the thread: the order of batches is kept)
            self._inline_active = True
            try:
                self._execute_streaming(batch_id, entries, runnable, t0, t1, True)
            finally:
                with self._inline_reader:  # no thread is reading the socket once the loop goes on
                    self._inline_active = False
        else:
            execute_thread.submit(self._execute_streaming, batch_id, entries, runnable, t0, t1)

    def _execute_streaming(self, batch_id: int, entries: list[Any], runnable: list[Request], t0: int,
                           t1: int, inline: bool = False) -> None:
        """Execute thread (or the main thread, `inline`): run the batch; an error in the result ends that
        request (no FINAL will come)."""
        outbox = self._outbox
        assert outbox is not None
        failed: list[int] = []
        start = _now_ns()
        try:
            header, out_frames = self._execute(batch_id, entries, runnable, t0, t1, failed)
        except Exception as exc:  # a bug on our side: still answer, or the supervisor's slot stays taken
            self._log("execute failed: %r" % exc)
            error = wire_error(exc)
            ids = [e.request_id if type(e) is Request else e[0] for e in entries]
            failed = ids
            header, out_frames = self._results.failed_batch(batch_id, ids, error), []
        fast = _now_ns() - start < INLINE_MAX_NS
        for request_id in failed:
            self._end_stream(request_id)
        self._flush_metrics()
        try:
            outbox.post_encoded(header, out_frames)
        finally:  # (after the post: a batch run inline next posts its result after this one)
            with self._open_lock:
                self._fast_streak = self._fast_streak + 1 if fast else 0
                if not inline:
                    self._queued_batches -= 1

    def _emit(self, request: Request, response: Optional[Response], final: bool) -> None:
        """One response of a decoupled request (None: a flag-only final); any thread."""
        outbox = self._outbox
        if outbox is None:
            raise InferdError(ErrorCode.INTERNAL, "responses can only be streamed by decoupled models")
        header, frames = self._results.stream_response(request, response, final)
        if final:
            self._end_stream(request.request_id)
        self._flush_metrics()
        outbox.post_encoded(header, frames)

    def _hold_emits(self) -> None:
        if self._outbox is not None:
            self._outbox.hold()

    def _release_emits(self) -> None:
        if self._outbox is not None:
            self._outbox.release()

    def _end_stream(self, request_id: int) -> None:
        with self._open_lock:
            self._open.discard(request_id)
            self._cancelled.discard(request_id)
