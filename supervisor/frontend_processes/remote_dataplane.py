"""The DataPlane of a frontend process: every call answered by the core over the link, or from its snapshot.

Synchronous reads (live, ready, server metadata, a model's handle: its metadata, config and decoupled flag,
model ready) come from the last snapshot the core pushed (snapshot.View); the core pushes one on every
change and, after a load, unload or shm (un)registration, answers the caller only once every frontend has
acknowledged it, so no frontend serves state older than a change a client has seen completed. The
DataPlane's control calls (statistics, status, the repository index, settings, shm register/unregister/
status, readiness that asks a model's is_ready()) are CONTROL frames to the core. Client system shared
memory is read and written here with this process's own fds, opened from the registrations the snapshot
lists (memory.client_shm.ClientShm, the same checks as the core's).

Inference: each request is one INFER frame; inputs above INLINE_MAX_BYTES are first written into a region
of this process's ShmPool and sent by handle, which the core passes to the worker without copying. A lease
is released only when the core answers the call (always exactly once, cancelled or not), never while a
worker may still read it. Large outputs come by their worker region's handle (output_regions.py); RELEASE
tells the core once the response's views of them are collected. A lost link fails every call in flight at
once with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from .. import logs
from ..core import classification
from ..core.busy_poll import BusyPoll
from ..core.dataplane import DataPlane, ResponseError
from ..core.model_handle import ModelHandle
from ..inference.types import InferRequest, InferResponse
from ..memory.client_shm import ClientShm
from ..memory.shm_pool import ShmPool
from ..tracing import live
from . import frames
from .direct_instances import DirectPeers
from .direct_models import DirectModels
from .frames import Kind, Op
from .link import Link
from .output_regions import OutputRegions
from .snapshot import View
from .stats_relay import StatsRelay

log = logging.getLogger("inferd.scaleout")

STREAM_LIMIT = 4096  # responses buffered per stream before it is failed (as core.streaming.ResponseStream)
_RESULT = int(Kind.RESULT)  # the hot kind as a plain int (an IntEnum member costs a lookup per compare)
LINK_LOST = "the frontend process lost its link to the server core"


class _Call:
    __slots__ = ("future", "leases", "queue", "watch")

    def __init__(self, future: asyncio.Future[Any] | None, leases: list[Any],
                 queue: collections.deque[Any] | None = None) -> None:
        self.future = future  # what the caller awaits (None for a stream)
        self.leases = leases  # input regions, released when the core answers
        self.queue = queue  # a stream's items (response or error, final)
        self.watch: Any = None  # the future's done callback that sends CANCEL, removed once answered


class RemoteDataPlane(DataPlane):
    def __init__(self, pool: ShmPool | None = None) -> None:
        self.link: Link | None = None
        self.outputs: OutputRegions | None = None  # workers' output regions mapped here (made on connect)
        self.view = View()
        self.pool = pool if pool is not None else ShmPool()
        self.client_shm = ClientShm(cuda_probe=False)
        self.lost = asyncio.Event()
        self.first_snapshot = asyncio.Event()
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self._wakers: dict[int, asyncio.Event] = {}
        self._log_settings: dict[str, Any] | None = None  # as the core last pushed them
        self._loop: asyncio.AbstractEventLoop | None = None  # set on connect: get_running_loop costs a getpid
        # the direct path (direct_models.py), when enabled before connect: simple models' requests go to their
        # workers over this process's own connections, not through the core
        self.direct: DirectModels | None = None
        # (set by frontend_main) polls this process's loop while requests come one at a time, as the core's does;
        # its Executes then ask their workers to poll too (core/busy_poll.py)
        self.busy_poll: BusyPoll | None = None
        self._acking: asyncio.Future[Any] | None = None  # a snapshot acknowledgement waiting for drains

    def enable_direct(self, run_dir: str) -> None:
        peers = DirectPeers(run_dir)
        peers.open()
        relay = StatsRelay(self._send_stats)
        self.direct = direct = DirectModels(peers, self.pool, relay)
        relay.inflight = direct.inflight

    def _send_stats(self, doc: dict[str, Any], pull: int) -> None:
        if self.link is not None:
            self.link.send(Kind.STATS, pull, frames.dumps(doc))

    async def connect(self, path: str, max_frame: int) -> None:
        loop = self._loop = asyncio.get_running_loop()
        _, link = await loop.create_unix_connection(
            lambda: Link(self._on_frame, self._on_lost, max_frame), path)
        self.link = link
        self.outputs = OutputRegions(self._release)
        hello: dict[str, Any] = {"pid": os.getpid()}
        if self.direct is not None:
            hello["direct"] = self.direct.peers.endpoint
        link.send(Kind.HELLO, 0, frames.dumps(hello))

    def _release(self, call: int) -> None:
        """The outputs of `call` that came by handle are no longer read: the worker may reuse their region."""
        if self.link is not None:
            self.link.send(Kind.RELEASE, call, b"")

    # ---------------------------------------------------------------- link events
    def _on_frame(self, kind: int, call: int, header: memoryview, data: memoryview) -> None:
        try:
            self._dispatch(kind, call, header, data)
        except Exception:  # a frame we cannot read is a bug of ours: that call fails, the link goes on
            log.exception("frontend link: bad frame of kind %d", kind)
            c = self._calls.pop(call, None)
            if c is not None and call:
                err = InferdError(ErrorCode.INTERNAL, "internal error")
                if c.queue is not None:
                    self._stream_put(call, c, err, True)
                else:
                    self._settle(c, None, err)

    def _dispatch(self, kind: int, call: int, header: memoryview, data: memoryview) -> None:
        if kind == _RESULT:
            h = frames.loads(header)
            attach = None
            if frames.by_handle(h):  # large outputs in a worker's region: mapped here, released when collected
                assert self.outputs is not None
                attach = functools.partial(self.outputs.view, call)
            try:
                resp = frames.decode_response(h, data, attach)
            except BaseException:
                if attach is not None:
                    self._release(call)
                raise
            c = self._calls.pop(call, None)
            if c is not None:
                self._settle(c, resp, None)
        elif kind == Kind.ERROR:
            c = self._calls.pop(call, None)
            if c is not None:
                err = frames.error_of(frames.loads(header))
                if c.queue is not None:
                    self._stream_put(call, c, err, True)
                else:
                    self._settle(c, None, err)
        elif kind == Kind.STREAM_ITEM:
            c = self._calls.get(call)
            if c is not None:
                h = frames.loads(header)
                final = bool(h.get("final"))
                item: Any = None  # None: the stream ended after its last response
                if "error" in h:
                    item = frames.error_of({"code": h["error"][0], "message": h["error"][1]})
                    if h.get("answer"):
                        item = ResponseError(item.code, item.message)
                elif "response" in h:
                    item = frames.decode_response(h["response"], data)
                if final:
                    del self._calls[call]
                self._stream_put(call, c, item, final)
        elif kind == Kind.CONTROL_RESULT:
            c = self._calls.pop(call, None)
            if c is not None:
                self._settle(c, frames.loads_revived(header).get("value"), None)
        elif kind == Kind.SNAPSHOT:
            self._apply(frames.loads(header))
        elif kind == Kind.PING:
            if self.link is not None:
                self.link.send(Kind.PONG, call, b"")
        elif kind == Kind.STATS_PULL:
            if self.direct is not None:
                self.direct.relay.flush(call)
            else:
                self._send_stats({"rows": []}, call)
        else:
            log.error("frontend link: unexpected frame kind %d", kind)

    def _settle(self, c: _Call, value: Any, err: InferdError | None) -> None:
        for lease in c.leases:
            lease.release()
        c.leases.clear()
        f = c.future
        if f is not None and not f.done():
            if c.watch is not None:  # answered: no CANCEL to send (and no callback to schedule)
                f.remove_done_callback(c.watch)
            if err is not None:
                f.set_exception(err)
            else:
                f.set_result(value)

    def _stream_put(self, call: int, c: _Call, item: Any, final: bool) -> None:
        if final:
            for lease in c.leases:
                lease.release()
            c.leases.clear()
        q = c.queue
        assert q is not None
        if not final and len(q) >= STREAM_LIMIT:
            self._cancel(call)  # a consumer this far behind: the request ends (as ResponseStream)
            item, final = InferdError(ErrorCode.UNAVAILABLE, "the client is not reading the responses"), True
        q.append((item, final))
        waker = self._wakers.get(call)
        if waker is not None:
            waker.set()

    def _on_lost(self, exc: Exception | None) -> None:
        err = InferdError(ErrorCode.UNAVAILABLE, LINK_LOST)
        calls, self._calls = self._calls, {}
        for call, c in calls.items():
            if c.queue is not None:
                self._stream_put(call, c, err, True)
            else:
                self._settle(c, None, err)
        self.lost.set()

    def _apply(self, doc: dict[str, Any]) -> None:
        self.view = View(doc)
        live.armed = bool(doc.get("trace_armed"))  # a client's traceparent is kept only while tracing
        log_settings = doc.get("log")
        if log_settings and log_settings != self._log_settings:
            self._log_settings = log_settings
            logs.apply(log_settings["log_verbose_level"], log_settings["log_format"], log_settings["log_info"],
                       log_settings["log_warning"], log_settings["log_error"])
        self._mirror_shm(doc.get("shm") or [])
        waits = self.direct.apply(doc.get("direct") or {}) if self.direct is not None else []
        if waits or self._acking is not None:  # acknowledged in order, once what the core waits for is done
            self._acking = asyncio.ensure_future(self._ack_later(self._acking, waits, self.view.version))
        else:
            self._ack(self.view.version)
        self.first_snapshot.set()

    def _ack(self, version: int) -> None:
        if self.link is not None:
            self.link.send(Kind.SNAPSHOT_ACK, 0, frames.dumps({"version": version}))

    async def _ack_later(self, before: asyncio.Future[Any] | None, waits: list[Any], version: int) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        await asyncio.gather(*waits, return_exceptions=True)
        self._ack(version)
        if self._acking is asyncio.current_task():
            self._acking = None

    def _mirror_shm(self, regions: list[Any]) -> None:
        """Open the client regions the core registered, close the ones it dropped (by this process's fds)."""
        shm = self.client_shm
        wanted = {name: (key, offset, size) for name, key, offset, size in regions}
        for name, r in list(shm.system.items()):
            if wanted.get(name) != (r.key, r.offset, r.byte_size):
                shm.unregister("system", name, held_too=True)  # (the core refused it while it was in use)
        for name, (key, offset, size) in wanted.items():
            if name not in shm.system:
                try:
                    shm.register("system", name, key=key, offset=offset, byte_size=size)
                except InferdError as exc:  # gone since the core opened it: requests naming it fail
                    log.warning("cannot open client shared memory region '%s': %s", name, exc.message)

    # ---------------------------------------------------------------- calls
    def _send(self, kind: int, call: int, header: bytes, chunks: list[Any] | None = None, size: int = 0) -> None:
        link = self.link
        if link is not None and len(header) + size > link.max_frame - 64:  # the core would drop the link
            raise InferdError(ErrorCode.INVALID_ARG, "request too large: %d bytes to pass to the server core "
                              "(at most %d)" % (len(header) + size, link.max_frame - 64))
        if link is None or not link.send(kind, call, header, chunks, size):
            raise InferdError(ErrorCode.UNAVAILABLE, LINK_LOST)

    def _cancel(self, call: int) -> None:
        link = self.link
        if link is not None:
            link.send(Kind.CANCEL, call, b"")

    def _start(self, kind: int, request: InferRequest, future: asyncio.Future[Any] | None,
               queue: collections.deque[Any] | None = None) -> int:
        leases: list[Any] = []
        try:
            for t in request.inputs:
                data = t.data
                nbytes = data.nbytes if type(data) is memoryview else memoryview(data).nbytes
                if nbytes > m.INLINE_MAX_BYTES and t.shm_ref is None:  # by handle: the core never copies it
                    lease = self.pool.lease(nbytes)
                    leases.append(lease)
                    lease.write(data)
                    t.shm_ref = (lease.name, lease.offset)
            header, chunks, size = frames.request_parts(request)
            call = next(self._ids)
            self._send(kind, call, header, chunks, size)
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        self._calls[call] = _Call(future, leases, queue)
        return call

    def infer_nowait(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        direct = self.direct
        if direct is not None and not live.armed:  # (tracing: every request through the core, which traces)
            serial = getattr(request.model, "direct", None)
            if serial is not None and not request.shm_hold and not _classifies(request):
                model = direct.get(serial)
                if model is not None and model.ready:  # (none connected yet, or all gone: the core answers)
                    if self.busy_poll is not None:
                        self.busy_poll.poke(model.scheduler.idle)
                    return model.submit(request)
        future: asyncio.Future[InferResponse] = (self._loop or asyncio.get_running_loop()).create_future()
        call = self._start(Kind.INFER, request, future)
        c = self._calls[call]
        c.watch = lambda f: self._cancel(call) if f.cancelled() and call in self._calls else None
        future.add_done_callback(c.watch)
        return future

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.infer_nowait(request)

    async def stream_infer(self, request: InferRequest) -> AsyncIterator[InferResponse | InferdError]:
        queue: collections.deque[Any] = collections.deque()
        call = self._start(Kind.STREAM, request, None, queue)
        waker = self._wakers[call] = asyncio.Event()
        ended = False
        try:
            while True:
                while not queue:
                    waker.clear()
                    await waker.wait()
                item, final = queue.popleft()
                if final:
                    ended = True
                    if isinstance(item, InferdError):
                        raise item
                    if item is not None:
                        yield item
                    return
                yield item
        finally:
            del self._wakers[call]
            if not ended and call in self._calls:
                self._cancel(call)  # the consumer went away: the core cancels; leases wait for its answer

    async def _control(self, op: Op, *args: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        call = next(self._ids)
        self._send(Kind.CONTROL, call, frames.dumps({"op": int(op), "args": list(args)}))
        self._calls[call] = _Call(future, [])
        return await future

    # ---------------------------------------------------------------- DataPlane: snapshot reads
    def live(self) -> bool:
        return bool(self.view.doc["live"])

    def ready(self) -> bool:
        return bool(self.view.doc["ready"]) and not self.lost.is_set()

    def server_metadata(self) -> dict[str, Any]:
        return dict(self.view.doc["server"])

    def model(self, name: str, version: str = "") -> ModelHandle:
        return self.view.model(name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.view.model_ready(name, version)

    async def model_ready_async(self, name: str, version: str = "") -> bool:
        if not self.view.model_asks(name, version):
            return self.view.model_ready(name, version)
        return bool(await self._control(Op.MODEL_READY, name, version))  # its is_ready(), asked in the core

    async def ready_async(self) -> bool:
        if not self.view.doc.get("ready_asks") or not self.ready():
            return self.ready()
        return bool(await self._control(Op.READY)) and not self.lost.is_set()

    # ---------------------------------------------------------------- DataPlane: control calls
    async def model_statistics_async(self, name: str = "", version: str = "") -> dict[str, Any]:
        return await self._control(Op.STATISTICS, name, version)  # type: ignore[no-any-return]

    async def status_async(self, name: str = "") -> dict[str, Any]:
        return await self._control(Op.STATUS, name)  # type: ignore[no-any-return]

    async def repository_index_async(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return await self._control(Op.REPOSITORY_INDEX, ready_only)  # type: ignore[no-any-return]

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        await self._control(Op.LOAD, name, parameters)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._control(Op.UNLOAD, name, unload_dependents)

    async def restart_model(self, name: str) -> dict[str, Any]:
        return await self._control(Op.RESTART, name)  # type: ignore[no-any-return]

    async def log_settings_async(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._control(Op.LOG_SETTINGS, update)  # type: ignore[no-any-return]

    async def trace_settings_async(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._control(Op.TRACE_SETTINGS, model, update)  # type: ignore[no-any-return]

    async def shm_status_async(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        return await self._control(Op.SHM_STATUS, kind, name)  # type: ignore[no-any-return]

    async def shm_register_async(self, kind: str, name: str, **fields: Any) -> None:
        await self._control(Op.SHM_REGISTER, kind, name, fields)

    async def shm_unregister_async(self, kind: str, name: str = "") -> None:
        await self._control(Op.SHM_UNREGISTER, kind, name)

    async def load_report_async(self, fmt: str, model: str = "") -> str | None:
        value = await self._control(Op.LOAD_REPORT, fmt, model)  # the models' metrics live in the core
        return value if isinstance(value, str) else None

    def metrics_text(self) -> bytes:
        raise InferdError(ErrorCode.INTERNAL, "the metrics port is served by the core process only")

    # ---------------------------------------------------------------- client shared memory, read here
    def shm_check_allowed(self) -> None:
        if not self.view.doc.get("shm_allowed"):
            from ..core.shm_endpoints import CLIENT_SHM_DISABLED

            raise InferdError(ErrorCode.UNSUPPORTED, CLIENT_SHM_DISABLED)

    def shm_check(self, region: str, offset: int, byte_size: int) -> None:
        if not self.view.doc.get("shm_allowed"):
            raise _no_region(region)
        self.client_shm.check(region, offset, byte_size)

    def shm_hold(self, names: Any) -> Any:
        return self.client_shm.hold(names)  # (sent with the request: the core, which unregisters, holds them too)

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> Any:
        if not self.view.doc.get("shm_allowed"):
            raise _no_region(region)
        return self.client_shm.read(region, offset, byte_size, False)  # CUDA regions: not with frontend processes

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        if not self.view.doc.get("shm_allowed"):
            raise _no_region(region)
        self.client_shm.write(region, offset, data)


def _classifies(request: InferRequest) -> bool:
    """Whether an output asks for classification (the core has the labels)."""
    return bool(request.outputs) and classification.requested(request.outputs) is not None


def _no_region(region: str) -> InferdError:
    return InferdError(ErrorCode.NOT_FOUND, "Unable to find shared memory region: '%s'" % region)
