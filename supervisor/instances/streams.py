"""The open decoupled requests of one worker: from their Execute to their final StreamResponse.

A decoupled request (`InferRequest.response_sink` set) stays open after its batch's ExecuteResult:
its shared-memory input leases are held until its final response (the model may read its inputs from
another thread), its responses go to the sink as they arrive, an error in the ExecuteResult ends it,
and a worker's death fails it like the batches in flight.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from inferd.supervisor.inference.types import InferResponse
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import InferdError

from . import results
from .outputs import WorkerOutputs
from .packing import OpenStream, release_leases


class OpenStreams:
    """Request id -> open decoupled request, for one worker. `cancel(rid)` tells the worker a client
    gave up on one; `kill(reason)` is called when the worker sent a malformed stream response."""

    __slots__ = ("by_id", "_cancel", "_kill")

    def __init__(self, cancel: Callable[[int], None], kill: Callable[[str], None]) -> None:
        self.by_id: dict[int, OpenStream] = {}
        self._cancel = cancel
        self._kill = kill

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, streams: dict[int, OpenStream]) -> None:
        """Open the streams of a batch about to be sent."""
        self.by_id.update(streams)

    def attach(self, streams: dict[int, OpenStream]) -> None:
        """Once their Execute is sent: a client that goes away cancels its stream."""
        for rid, stream in streams.items():
            stream.sink.attach(functools.partial(self._cancel_open, rid))

    def ids_of(self, wanted: set[int], skip: Sequence[int]) -> list[int]:
        """Request ids of the open streams whose request (by `id()`) is in `wanted`, not in `skip`."""
        return [rid for rid, stream in self.by_id.items() if id(stream.request) in wanted and rid not in skip]

    def end_failed(self, ids: Sequence[int], responses: Sequence[Any]) -> None:
        """A decoupled request answered with an error in its ExecuteResult has ended (no final follows)."""
        by_id = self.by_id
        for rid, response in zip(ids, responses, strict=False):
            if isinstance(response, InferdError) and rid in by_id:
                self.end(rid, response)

    def on_response(self, msg: m.StreamResponse, data: Sequence[Any], model_version: str,
                    outputs: WorkerOutputs) -> None:
        stream = self.by_id.get(msg.request_id)
        if stream is None:
            return  # ended already (failed, or its worker was replaced): late responses are dropped
        try:
            item = results.stream_response(stream.request, msg, data, model_version, outputs)
        except (TypeError, ValueError, AttributeError) as exc:
            self._kill(f"sent a malformed stream response ({exc!r})")
            return
        if msg.final:
            self.end(msg.request_id, item)
        elif msg.response is not None:
            stream.sink.put(item, False)

    def end(self, rid: int, last: InferResponse | InferdError | None = None) -> None:
        """Close one stream: its leases go back, `last` (if any) is its final response."""
        stream = self.by_id.pop(rid, None)
        if stream is None:
            return
        release_leases(stream.leases)
        if last is not None:
            stream.sink.put(last, True)

    def end_all(self, ids: Iterable[int], err: InferdError | None = None) -> None:
        for rid in list(ids):
            self.end(rid, err)

    def fail_all(self, err: InferdError) -> None:
        """The worker is gone: every open stream ends with `err`."""
        self.end_all(self.by_id, err)

    def _cancel_open(self, rid: int) -> None:
        if rid in self.by_id:
            self._cancel(rid)
