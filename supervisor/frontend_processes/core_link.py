"""The core's end of the frontend links: one `Session` per frontend process, and the snapshot publisher.

A session serves its frontend's calls over the ordinary data plane (ServerDataPlane): INFER and STREAM
frames become InferRequests submitted as a frontend in this process would submit them, and every call is
answered exactly once (RESULT, ERROR or a final STREAM_ITEM), cancelled or not, so the frontend knows
when its input regions are free again. Inputs by handle are mapped here (`_Regions`, not copied) and
keep their handle as Tensor.shm_ref, which instances/packing.py passes to the worker unchanged. Large
outputs in a worker's region go by that region's handle; the response (and so the region) is held until
the frontend's RELEASE. A lost link cancels everything its frontend had in flight and drops what it held.

publisher.py pushes the snapshot to every session after each change.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable
from typing import Any

from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

from ..core.dataplane import ResponseError
from ..core.dataplane_impl import ServerDataPlane
from ..inference.types import InferResponse
from . import direct_core, frames
from .frames import Kind, Op
from .link import Link
from .publisher import Publisher

log = logging.getLogger("inferd.scaleout")

MAX_INFLIGHT = 65536  # calls one frontend may have open at once; beyond: UNAVAILABLE
MAX_HELD = 4096  # responses one frontend may hold by handle at once; beyond, outputs are copied inline
MAX_REGIONS = 256  # mappings of one frontend's regions kept here (least recently used dropped)

CUDA_SHM_UNSUPPORTED = "CUDA shared memory is not supported with --frontend-processes greater than 1"

# the hot kinds as plain ints (comparing with an IntEnum member costs a class attribute lookup each time)
_INFER, _RESULT = int(Kind.INFER), int(Kind.RESULT)

# ops that change what the snapshot shows: answered once every frontend has the new one
_MUTATING = frozenset({Op.LOAD, Op.UNLOAD, Op.SHM_REGISTER, Op.SHM_UNREGISTER, Op.TRACE_SETTINGS, Op.LOG_SETTINGS,
                       Op.RESTART})


class _Regions:
    """One frontend's input regions mapped here (by handle, under /proc/<frontend>/fd), LRU-bounded."""

    def __init__(self) -> None:
        self.pid = 0
        self._maps: collections.OrderedDict[str, shm.Region] = collections.OrderedDict()

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        if not shm.is_handle(name) or shm.owner_pid(name) != self.pid:
            raise InferdError(ErrorCode.INTERNAL, "a frontend passed a region it does not own")
        region = self._maps.get(name)
        if region is None:
            region = shm.attach(name, readonly=True)  # the core only reads (validation, cache keys)
            self._maps[name] = region
            while len(self._maps) > MAX_REGIONS:
                self._maps.popitem(last=False)[1].close()
        else:
            self._maps.move_to_end(name)
        if offset < 0 or nbytes < 0 or offset + nbytes > region.size:
            raise InferdError(ErrorCode.INTERNAL, "tensor reference lies outside its shared memory region")
        buf = region.buf
        assert buf is not None
        return buf[offset:offset + nbytes]

    def close(self) -> None:
        for region in self._maps.values():
            region.close()
        self._maps.clear()


class Session:
    def __init__(self, dp: ServerDataPlane, publisher: Publisher, max_frame: int) -> None:
        self.dp = dp
        self.publisher = publisher
        self.link = Link(self._on_frame, self._on_lost, max_frame, throttle_reads=True)
        self.regions = _Regions()
        self.acked = 0  # the latest snapshot version this frontend applied
        self.serving = False  # its servers listen (Kind.SERVING)
        self._time = asyncio.get_running_loop().time
        self.last_seen = self._time()  # when a frame last came (watchdog.py)
        self.inflight: dict[int, asyncio.Future[Any]] = {}
        # responses whose large outputs went by their worker region's handle, until the frontend's RELEASE
        self.held: dict[int, InferResponse] = {}
        self.direct_endpoint = ""  # its listener for the workers of direct versions (direct_core.py), if any
        self.direct_inflight: dict[tuple[int, str], int] = {}  # its direct requests in flight, as last pulled
        self.direct_pending: dict[int, int] = {}  # and queued, per version serial

    # ---------------------------------------------------------------- frames
    def _on_frame(self, kind: int, call: int, header: memoryview, data: memoryview) -> None:
        self.last_seen = self._time()
        try:
            if kind == _INFER:
                self._infer(call, header, data)
            elif kind == Kind.CANCEL:
                f = self.inflight.get(call)
                if f is not None:
                    f.cancel()
            elif kind == Kind.STREAM:
                self._begin(call, self._stream(call, header, data))
            elif kind == Kind.CONTROL:
                self._begin(call, self._control(call, frames.loads_revived(header)))
            elif kind == Kind.RELEASE:
                self.held.pop(call, None)  # its views go: the worker gets its region back (instances/outputs.py)
            elif kind == Kind.SNAPSHOT_ACK:
                self.acked = int(frames.loads(header)["version"])
                self.publisher.acked()
            elif kind == Kind.PONG:
                pass  # last_seen is all it is for
            elif kind == Kind.SERVING:
                self.serving = True
                self.publisher.acked()  # wakes serving() too
            elif kind == Kind.STATS:
                doc = frames.loads(header)
                direct_core.replay(self.dp, doc.get("rows") or [])
                if "inflight" in doc:
                    self.direct_inflight = direct_core.inflight_table(doc["inflight"])
                    self.direct_pending = direct_core.pending_table(doc.get("pending"))
                if call:
                    self.publisher.pulled(self, call)
            elif kind == Kind.HELLO:
                hello = frames.loads(header)
                self.regions.pid = int(hello["pid"])
                endpoint = hello.get("direct")
                self.direct_endpoint = endpoint if isinstance(endpoint, str) and endpoint.startswith("ipc://") else ""
                self.publisher.add(self)
            else:
                log.error("frontend link: unexpected frame kind %d", kind)
        except InferdError as exc:
            self.link.send(Kind.ERROR, call, frames.error_header(exc))
        except Exception as exc:  # a malformed frame from our own frontend is a bug: fail that call only
            log.exception("frontend link: bad frame")
            self.link.send(Kind.ERROR, call, frames.error_header(InferdError(ErrorCode.INTERNAL, str(exc))))

    def _admit(self, call: int) -> None:
        if len(self.inflight) >= MAX_INFLIGHT:
            raise InferdError(ErrorCode.UNAVAILABLE, "too many requests in flight from one frontend process")
        if call in self.inflight:
            raise InferdError(ErrorCode.INTERNAL, "a frontend reused a call id in flight")

    def _infer(self, call: int, header: memoryview, data: memoryview) -> None:
        self._admit(call)
        request = frames.decode_request(header, data, self.regions.view)
        if request.shm_hold:  # the client shm regions the frontend read it with: held here while it runs
            request.shm_hold = self.dp.shm_hold(request.shm_hold)
        future = self.dp.infer_nowait(request)
        self.inflight[call] = future
        future.add_done_callback(functools.partial(self._answer, call))  # no lambda frame per answer

    def _answer(self, call: int, future: asyncio.Future[InferResponse]) -> None:
        self.inflight.pop(call, None)
        link = self.link
        if future.cancelled():
            link.send(Kind.ERROR, call, frames.error_header(InferdError(ErrorCode.CANCELLED, "request cancelled")))
            return
        exc = future.exception()
        if exc is None:
            try:
                resp = future.result()
                # beyond MAX_HELD: copied inline (a frontend slow to release)
                head, chunks, size, held = frames.result_parts(resp, len(self.held) < MAX_HELD)
                if held:
                    self.held[call] = resp
                link.send(_RESULT, call, frames.dumps(head), chunks, size)
                return
            except InferdError as err:
                exc = err
        if not isinstance(exc, InferdError):
            log.error("request failed: %r", exc)
            exc = InferdError(ErrorCode.INTERNAL, "internal error")
        link.send(Kind.ERROR, call, frames.error_header(exc))

    def _begin(self, call: int, work: Any) -> None:
        try:
            self._admit(call)
        except InferdError:
            work.close()
            raise
        task = asyncio.ensure_future(work)
        self.inflight[call] = task
        task.add_done_callback(lambda t: self._ended(call, t))

    def _ended(self, call: int, task: asyncio.Future[Any]) -> None:
        self.inflight.pop(call, None)
        if task.cancelled():  # cancelled before it answered: the call still gets its one answer
            self.link.send(Kind.ERROR, call, frames.error_header(InferdError(ErrorCode.CANCELLED, "request cancelled")))
        elif task.exception() is not None:
            log.error("frontend call failed: %r", task.exception())

    async def _stream(self, call: int, header: memoryview, data: memoryview) -> None:
        request = frames.decode_request(header, data, self.regions.view)
        if request.shm_hold:
            request.shm_hold = self.dp.shm_hold(request.shm_hold)
        link = self.link
        try:
            async for item in self.dp.stream_infer(request):
                if isinstance(item, InferdError):
                    link.send(Kind.STREAM_ITEM, call, frames.dumps({"final": False,
                                                                    "error": [int(item.code), item.message]}))
                else:
                    head, chunks, size = frames.response_parts(item)
                    link.send(Kind.STREAM_ITEM, call, frames.dumps({"final": False, "response": head}), chunks, size)
                await link.drain()
        except InferdError as exc:  # ("answer": a ResponseError, the request's answer rather than its refusal)
            link.send(Kind.STREAM_ITEM, call, frames.dumps({"final": True, "error": [int(exc.code), exc.message],
                                                            "answer": isinstance(exc, ResponseError)}))
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stream failed")
            link.send(Kind.STREAM_ITEM, call, frames.dumps({"final": True, "error": [int(ErrorCode.INTERNAL),
                                                                                     "internal error"]}))
            return
        link.send(Kind.STREAM_ITEM, call, frames.dumps({"final": True, "end": True}))

    async def _control(self, call: int, doc: dict[str, Any]) -> None:
        op = Op(int(doc["op"]))
        args = doc.get("args") or []
        try:
            value = await self._run(op, args)
            if op in _MUTATING:
                await self.publisher.sync()
            self.link.send(Kind.CONTROL_RESULT, call, frames.dumps({"value": value}))
        except InferdError as exc:
            if op in _MUTATING:
                await self.publisher.sync()  # a failed load may still have changed the index
            self.link.send(Kind.ERROR, call, frames.error_header(exc))

    async def _run(self, op: Op, args: list[Any]) -> Any:
        dp = self.dp
        if op == Op.STATISTICS:
            return await dp.model_statistics_async(*args)
        if op == Op.STATUS:
            return await dp.status_async(*args)
        if op == Op.REPOSITORY_INDEX:
            return dp.repository_index(*args)
        if op == Op.LOAD:
            return await dp.load_model(args[0], args[1])
        if op == Op.UNLOAD:
            return await dp.unload_model(args[0], args[1])
        if op == Op.RESTART:
            return await dp.restart_model(args[0])
        if op == Op.SHM_STATUS:
            return dp.shm_status(*args)
        if op == Op.SHM_REGISTER:
            if args[0] == "cuda":  # a frontend process reads clients' regions itself: host memory only
                dp.shm_check_allowed()  # disabled client shm answers first, as with one process
                raise InferdError(ErrorCode.UNSUPPORTED, CUDA_SHM_UNSUPPORTED)
            return dp.shm_register(args[0], args[1], **args[2])
        if op == Op.SHM_UNREGISTER:
            return dp.shm_unregister(*args)
        if op == Op.TRACE_SETTINGS:
            return dp.trace_settings(*args)
        if op == Op.LOG_SETTINGS:
            return dp.log_settings(*args)
        if op == Op.MODEL_READY:
            return await dp.model_ready_async(*args)
        if op == Op.READY:
            return await dp.ready_async()
        if op == Op.LOAD_REPORT:
            return await dp.load_report_async(*args)
        raise InferdError(ErrorCode.INTERNAL, "unknown control op %d" % op)

    def _on_lost(self, exc: Exception | None) -> None:
        for future in list(self.inflight.values()):
            future.cancel()  # its clients are gone with the frontend
        self.inflight.clear()
        self.held.clear()
        self.regions.close()
        self.publisher.remove(self)


def server(dp: ServerDataPlane, publisher: Publisher, max_frame: int) -> Callable[[], Link]:
    """The protocol factory of the core's link socket (loop.create_unix_server)."""
    return lambda: Session(dp, publisher, max_frame).link
