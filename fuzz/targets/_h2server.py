"""inferd's HTTP/2 gRPC server side (grpc_api/native_server.py's NativeGrpcServer over http2/connection.py)
on an in-memory transport, for the HTTP/2 fuzz targets.

The methods are small stand-ins with the real request path: ModelInfer decodes with wire.decode_request,
builds the core request (convert.to_core) and answers its inputs back as outputs (wire.response_parts);
ModelStreamInfer does the same per message; ServerLive is a plain protobuf unary call. So what a client
sends comes back in the answer, and a differential can see every byte arrive.

`serve(reads)` runs one connection: the client preface, then each read handed to data_received at once
(no event-loop turn between them, so how the bytes are cut cannot change what happens), then the loop
turns until the calls settle. Anything the server logs as an error, and any exception escaping a callback
or task, is returned as a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.supervisor.grpc_api import convert, native_server, wire
from inferd.supervisor.grpc_api.http2 import abuse, connection, hpack_codec
from inferd.supervisor.grpc_api.http2 import frames as f
from inferd.supervisor.grpc_api.http2.grpc_calls import Method
from inferd.supervisor.grpc_api.http2.grpc_wire import INVALID_ARGUMENT, Abort
from inferd.supervisor.inference.types import InferResponse, Tensor
from inferd.worker.wire.errors import InferdError, invalid_arg

SERVICE = "/inference.GRPCInferenceService/"
MAX_MESSAGE = 1 << 20
SETTLE_TURNS = 40  # event-loop turns after the last read: every call here finishes in a few


class Plane:
    """Shared memory: zeros of the asked size, nothing written; no CUDA regions."""

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> bytes:
        if byte_size > MAX_MESSAGE:
            raise invalid_arg(f"region '{region}' is smaller than {byte_size} bytes")
        return bytes(byte_size)

    def shm_is_cuda(self, region: str) -> bool:
        return False

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        pass

    def shm_check(self, region: str, offset: int, byte_size: int) -> None:
        if offset < 0 or byte_size < 0:  # (read unsigned, as Triton reads them: out of any region's bounds)
            raise invalid_arg(f"Invalid offset for shared memory region: '{region}'")

    def shm_hold(self, names: Any) -> None:
        return None


PLANE: Any = Plane()


def _echo(request: Any) -> InferResponse:
    if request is convert.BAD:
        raise Abort(INVALID_ARGUMENT, convert.PARSE_ERROR)
    req, _shm = convert.to_core(request, PLANE)
    outputs = [Tensor(t.name, t.datatype, t.shape, t.data, dict(t.parameters)) for t in req.inputs]
    return InferResponse(req.model_name, req.model_version, req.id, outputs, dict(req.parameters))


def _infer_start(request: Any, context: Any) -> tuple[asyncio.Future[Any], Any]:
    future = asyncio.get_running_loop().create_future()
    future.set_result(_echo(request))
    return future, None


def _infer_finish(resp: InferResponse, state: Any) -> tuple[list[Any], int]:
    return wire.response_parts(resp, None, PLANE)


async def _stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        try:
            resp = _echo(request)
        except (InferdError, Abort) as exc:
            yield wire.encode_stream_error(getattr(exc, "message", str(exc)))
            continue
        yield wire.encode_stream_response(resp, None, PLANE, {"triton_final_response": True})


async def _live(request: Any, context: Any) -> Any:
    if request is convert.BAD:
        raise Abort(INVALID_ARGUMENT, convert.PARSE_ERROR)
    return pb.ServerLiveResponse(live=True)


METHODS = {
    SERVICE + "ModelInfer": Method(False, _live, wire.decode_request, start=_infer_start, finish=_infer_finish,
                                   errors=native_server._errors),
    SERVICE + "ModelStreamInfer": Method(True, _stream, wire.decode_request, errors=native_server._errors),
    SERVICE + "ServerLive": Method(False, _live, convert.deserializer(pb.ServerLiveRequest),
                                   pb.ServerLiveResponse.SerializeToString, errors=native_server._errors),
}


class Transport(asyncio.Transport):
    """What the server writes, kept; closing and aborting recorded (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = ""  # "", "close" or "abort"

    def write(self, data: Any) -> None:
        self.out += data

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def is_closing(self) -> bool:
        return bool(self.closed)

    def close(self) -> None:
        self.closed = self.closed or "close"

    def abort(self) -> None:
        self.closed = "abort"

    def can_write_eof(self) -> bool:
        return False  # _fail then closes at once instead of lingering on a timer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@dataclass
class Outcome:
    out: bytes = b""  # everything the server wrote
    closed: str = ""
    failures: list[str] = field(default_factory=list)  # errors logged, exceptions escaping callbacks
    opened: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # stream -> the headers it opened with


class _Recording(native_server.NativeGrpcServer):
    """The server, noting the headers each stream was opened with."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(METHODS, MAX_MESSAGE)
        self.outcome = outcome

    def open_stream(self, conn: Any, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> Any:
        self.outcome.opened[stream_id] = list(headers)
        return super().open_stream(conn, stream_id, headers, end_stream)


class _Errors(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"logged: {record.getMessage()} {record.exc_info[1]!r}" if record.exc_info else
                         f"logged: {record.getMessage()}")


class _FrozenClock:
    """The flood guard's clock, stopped for one connection: token buckets do not refill and PING intervals
    are all zero, so the same bytes meet the same limits however long a run takes (differentials compare
    two runs)."""

    @staticmethod
    def monotonic() -> float:
        return 1_000_000.0


@contextmanager
def frozen_flood_clock() -> Any:
    real = abuse.time
    abuse.time = _FrozenClock  # type: ignore[assignment]
    try:
        yield
    finally:
        abuse.time = real


_LOOP: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def check_bounds(conn: connection.H2Connection) -> None:
    """What one connection keeps between reads stays within its caps."""
    reader = conn.reader
    assert reader._hold_len <= connection.MAX_FRAME_IN + 9, f"reader holds {reader._hold_len} bytes"
    assert len(conn._header_block) <= connection.MAX_HEADER_BLOCK, "header block beyond its cap"
    d = conn.decoder
    assert d.size <= d.table_limit <= d.max_table, f"HPACK table {d.size} > {d.table_limit}"
    assert d.size == sum(len(n) + len(v) + 32 for n, v in d.dynamic), "HPACK table size miscounted"
    assert len(d.blocks) <= hpack_codec.BLOCK_CACHE, "HPACK block cache beyond its cap"
    assert len(conn.streams) <= connection.MAX_CONCURRENT_STREAMS, "streams beyond the limit"
    assert conn.partial_bytes == sum(conn.partial.values()) >= 0, "partial message bytes miscounted"
    pending = sum(len(p) for s in conn.streams.values() for p in s.pending)
    assert conn.pending_out == pending >= 0, f"pending_out {conn.pending_out} != {pending} waiting"


def serve(reads: list[bytes], client: Callable[[bytes], list[bytes]] | None = None) -> Outcome:
    """One connection fed `reads` (the preface included); with `client`, what the server wrote since the
    last turn is handed to it after each, and what it returns is fed next, until it returns nothing."""
    outcome = Outcome()
    handler = _Errors(outcome.failures)
    log = logging.getLogger("inferd.grpc")
    log.addHandler(handler)
    lp = loop()
    lp.set_exception_handler(lambda _lp, ctx: outcome.failures.append(
        f"escaped: {ctx.get('message')} {ctx.get('exception')!r}"))
    try:
        with frozen_flood_clock():
            lp.run_until_complete(_serve(reads, client, outcome))
    finally:
        log.removeHandler(handler)
    return outcome


async def _serve(reads: list[bytes], client: Callable[[bytes], list[bytes]] | None, outcome: Outcome) -> None:
    server = _Recording(outcome)
    conn = connection.H2Connection(server, None, server.pings)
    transport = Transport()
    conn.connection_made(transport)
    try:
        queue = list(reads)
        seen = 0
        while queue:
            for data in queue:
                conn.data_received(data)
                check_bounds(conn)
            queue = []
            await _settle()
            if client is not None and not transport.closed:  # the client reads what we wrote, and answers
                queue = client(bytes(transport.out[seen:]))
                seen = len(transport.out)
        check_bounds(conn)
    finally:
        conn.connection_lost(None)
        await _settle()  # cancelled stream tasks finish
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not tasks, f"tasks left running after the connection closed: {tasks}"
    outcome.out = bytes(transport.out)
    outcome.closed = transport.closed


async def _settle() -> None:
    """Turns of the event loop until nothing is ready to run (every call waits on the client or a timer)."""
    lp = asyncio.get_running_loop()
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
        if not lp._ready:  # type: ignore[attr-defined]  # BaseEventLoop's queue of callbacks due now
            return


def preface() -> bytes:
    return f.PREFACE
