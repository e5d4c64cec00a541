"""ModelStreamInfer: the bidirectional inference stream (reference/triton.md §2.3).

A reader task takes requests off the stream and starts them at once, in arrival order (so sequence
requests reach the scheduler in order); the handler writes responses. Non-decoupled requests put
their task into the output queue, so their responses leave in request order. Decoupled requests
put responses into the queue as they are produced (an error response of a decoupled request goes
out as `error_message` and its stream goes on). The queue is bounded: a client that does not read
stops us from reading further requests. Ending the stream (client cancel, or the client closes it)
cancels what still runs: decoupled requests that are streaming see `is_cancelled()`.

Errors go into `error_message` and the stream stays open, unless the client opened it with
metadata `triton_grpc_error: true`: then the first error ends the stream with its status.
With --grpc-header-forward-pattern, the stream's matching metadata become parameters of each request.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg

from .. import header_rules as access
from ..core.dataplane import DataPlane
from ..inference.types import FirstResponseError, InferRequest, InferResponse
from ..tracing import live
from . import convert, wire
from .errors import status_of

log = logging.getLogger("inferd.grpc")

FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
STREAM_WINDOW = 256  # requests in flight plus responses not yet written, per stream

_END = object()


def wants_grpc_error(context: Any) -> bool:
    for key, value in context.invocation_metadata() or ():
        if key == "triton_grpc_error":
            return str(value).lower() == "true"
    return False


def _internal(exc: BaseException) -> InferdError:
    log.error("stream request failed", exc_info=exc)
    return InferdError(ErrorCode.INTERNAL, "internal error")


class StreamInfer:
    def __init__(self, dataplane: DataPlane, window: int = STREAM_WINDOW,
                 forward: re.Pattern[str] | None = None) -> None:
        self.dp = dataplane
        self.window = window
        self.forward = forward  # --grpc-header-forward-pattern, compiled (access.forward_pattern)

    def _message(self, resp: InferResponse, shm: convert.ShmOutputs | None, final: bool) -> bytes:
        """A serialized ModelStreamInferResponse (the stream's serializer passes bytes through)."""
        return wire.encode_stream_response(resp, shm, self.dp, {FINAL: final})

    async def handle(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        grpc_error = wants_grpc_error(context)
        forwarded: dict[str, Any] = {}
        if self.forward is not None:
            access.forward_grpc(self.forward, context.invocation_metadata() or (), forwarded)
        queue: asyncio.Queue[Any] = asyncio.Queue(self.window)
        producers: set[asyncio.Task[None]] = set()
        reader = asyncio.create_task(self._read(request_iterator, queue, producers, forwarded, context))
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, asyncio.Task):
                    item = await item
                if isinstance(item, InferdError):
                    if grpc_error:
                        await context.abort(status_of(item), item.message)
                    yield wire.encode_stream_error(item.message)
                else:
                    yield item
            await reader
        finally:
            # client cancel, abort or end: cancel everything still running for this stream
            reader.cancel()
            for task in producers:
                task.cancel()
            while not queue.empty():
                item = queue.get_nowait()
                if isinstance(item, asyncio.Task):
                    item.cancel()

    async def _read(self, request_iterator: Any, queue: asyncio.Queue[Any], producers: set[Any],
                    forwarded: dict[str, Any], context: Any = None) -> None:
        dp = self.dp
        try:
            async for msg in request_iterator:
                if msg is convert.BAD:
                    await queue.put(invalid_arg(convert.PARSE_ERROR))
                    continue
                try:
                    handle = dp.model(msg.model_name, msg.model_version)  # its one lookup
                    req, shm = convert.to_core(msg, dp)
                except InferdError as exc:
                    await queue.put(exc)
                    continue
                req.model = handle
                if forwarded:
                    req.parameters.update(forwarded)
                if live.armed:  # tracing: the stream's W3C trace context is continued by each request
                    req.trace_parent = _traceparent(context)
                if handle.decoupled:
                    flag = msg.parameters.get(EMPTY_FINAL)
                    empty_final = flag is not None and flag[0] == "bool_param" and bool(flag[1])
                    task = asyncio.create_task(self._decoupled(req, shm, empty_final, queue))
                    producers.add(task)
                    task.add_done_callback(producers.discard)
                else:
                    await queue.put(asyncio.create_task(self._one(req, shm)))
            while producers:  # the stream ends after the last decoupled response
                await asyncio.wait(list(producers))
        except grpc.aio.AbortError:
            return  # the handler aborted the RPC (triton_grpc_error): nobody reads the queue any more
        except Exception as exc:
            await queue.put(_internal(exc))
        await queue.put(_END)

    async def _one(self, req: InferRequest, shm: convert.ShmOutputs | None) -> Any:
        try:
            return self._message(await self.dp.infer(req), shm, True)
        except FirstResponseError as exc:  # a response, then an error: as Triton, the stream passes the first
            return self._message(exc.response, shm, True)
        except InferdError as exc:
            return exc
        except Exception as exc:
            return _internal(exc)

    async def _decoupled(
        self, req: InferRequest, shm: convert.ShmOutputs | None, empty_final: bool, queue: asyncio.Queue[Any]
    ) -> None:
        # The core may mark a response with parameters[FINAL]; without a mark we hold one response
        # back so the last one can carry final=true.
        pending: InferResponse | None = None
        final_sent = False
        try:
            async for resp in self.dp.stream_infer(req):
                if isinstance(resp, InferdError):  # an error response; the request goes on
                    if pending is not None:
                        await queue.put(self._message(pending, shm, False))
                        pending = None
                    await queue.put(resp)
                    continue
                marked = resp.parameters.pop(FINAL, None) if resp.parameters else None
                if marked is None:
                    if pending is not None:
                        await queue.put(self._message(pending, shm, False))
                    pending = resp
                    continue
                if pending is not None:
                    await queue.put(self._message(pending, shm, False))
                    pending = None
                if resp.outputs or not marked or empty_final:
                    await queue.put(self._message(resp, shm, bool(marked)))
                final_sent = final_sent or bool(marked)
            if pending is not None:
                await queue.put(self._message(pending, shm, True))
            elif empty_final and not final_sent:
                # Triton's flag-only final carries the requested (not the resolved) version
                await queue.put(self._message(InferResponse(req.model_name, req.model_version, req.id), None, True))
        except InferdError as exc:
            if pending is not None:
                await queue.put(self._message(pending, shm, False))
            await queue.put(exc)
        except Exception as exc:
            await queue.put(_internal(exc))


def _traceparent(context: Any) -> str | None:
    value = access.first_value(context.invocation_metadata() or (), "traceparent") if context is not None else None
    return value.decode("latin-1") if isinstance(value, bytes) else value
