"""BLS: Python models calling other models (and loading / unloading them) through the supervisor.

A `BlsClient` owns a third DEALER socket (`<identity>/bls`) on a daemon thread, so calls work from
any thread — `execute` on the main thread, `async_exec` on the model's event loop, the model's own
threads — without touching the main socket. Callers queue a message and wake the thread through a
pipe; replies are matched by call id to a future (one response) or a queue (decoupled calls).
A synchronous `exec()` skips that thread: it sends and reads on its own thread's socket
(`<identity>/bls/<n>`, a DealerSocket that speaks ZMTP itself), so its reply wakes the caller directly.

Tensors travel by handle both ways. Inputs up to INLINE_MAX_BYTES ride as frames; larger ones are
written into regions this worker owns (`inferd_<pid>_b<n>`, reused per size class, unlinked at exit
and swept by the supervisor if the worker dies) and the callee maps them by name. Replies become
arrays in bls_replies.py.

Runs on Python 3.9+ (numpy, pyzmq, stdlib only).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import os
import queue
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import zmq

from . import bulk_copy
from .arena import Arena
from .bls_replies import BlsReply, ReplyReader
from .wire import bytes_codec, shm
from .wire.errors import ErrorCode, InferdError
from .wire.messages import (
    INLINE_MAX_BYTES,
    BlsCancel,
    BlsRelease,
    BlsRequest,
    BlsResponse,
    ModelControl,
    ModelControlResult,
    TensorRef,
    decode,
    encode_header,
)
from .zmtp_socket import DealerSocket, LinkClosed

BLS_SUFFIX = "/bls"
MAX_ARENA_BYTES = 1 << 30  # bound on this worker's input regions (busy + idle)
_END = object()  # marks the end of a decoupled call's response queue


def _link_lost(exc: LinkClosed) -> InferdError:
    return InferdError(ErrorCode.UNAVAILABLE, "BLS call failed: %s" % exc)


class _Call:
    __slots__ = ("future", "stream", "regions", "device", "done")

    def __init__(self, stream: bool) -> None:
        self.future: Optional[concurrent.futures.Future[Any]] = None if stream else concurrent.futures.Future()
        self.stream: Optional[queue.Queue[Any]] = queue.Queue() if stream else None
        self.regions: list[shm.Region] = []
        self.device: list[Any] = []  # device inputs passed by IPC handle: kept alive until the call ends
        self.done = False


class BlsClient:
    def __init__(self, context: zmq.Context, endpoint: str, identity: str) -> None:
        self._context = context
        self._endpoint = endpoint
        self._identity = identity + BLS_SUFFIX
        self._outgoing: collections.deque[list[Any]] = collections.deque()
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        # re-entrant: a garbage collection inside a locked section may run _release_later on this thread
        self._lock = threading.RLock()
        self._arena = Arena("b", MAX_ARENA_BYTES)
        # device inputs of calls in flight, by (handle, offset): a callee that hands one back (an identity
        # model) gives this process its own memory, which it cannot open by IPC handle
        self._own_device: weakref.WeakValueDictionary[tuple[str, int], Any] = weakref.WeakValueDictionary()
        self._replies = ReplyReader(self._lock, self._own_device, self._release_now, self._release_later)
        self._local = threading.local()  # per-thread DEALER for synchronous calls (`direct`)
        self._socket_ids = itertools.count(1)
        self._thread_sockets: list[DealerSocket] = []
        self._thread: Optional[threading.Thread] = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False

    # ---- API for pb_utils -------------------------------------------------------------------------

    def infer(self, model_name: str, model_version: str, request_id: str,
              inputs: Sequence[tuple[str, str, np.ndarray]], requested_outputs: Sequence[str],
              correlation_id: Any = 0, flags: int = 0, timeout_us: int = 0, parameters: str = "{}",
              decoupled: bool = False, direct: bool = False, trace: str = "") -> tuple[int, _Call]:
        """Send one request; returns (call id, call) whose future / stream yields BlsReply objects.
        `direct`: send it on the calling thread's own socket and take the reply with `wait_direct`."""
        call = _Call(decoupled)
        refs: list[TensorRef] = []
        frames: list[Any] = []
        try:
            for name, datatype, array in inputs:
                if type(array) is not np.ndarray and hasattr(array, "ptr"):  # a device.DeviceArray
                    refs.append(self._device_input(name, array))
                    call.device.append(array)
                    continue
                data = _wire_bytes(datatype, array)
                if data.nbytes <= INLINE_MAX_BYTES:
                    refs.append(TensorRef(name, datatype, [int(d) for d in array.shape], "frame", len(frames),
                                          "", 0, data.nbytes))
                    frames.append(data)
                else:
                    region = self._arena.put(data, bulk_copy.copy_into)
                    call.regions.append(region)
                    refs.append(TensorRef(name, datatype, [int(d) for d in array.shape], "shm", -1,
                                          region.name, 0, data.nbytes))
        except BaseException:
            self._arena.give_back(call.regions)
            raise
        with self._lock:
            call_id = next(self._ids)
            self._calls[call_id] = call
        message = BlsRequest(call_id, model_name, model_version, request_id, refs, list(requested_outputs),
                             correlation_id, int(flags), int(timeout_us), parameters, bool(decoupled),
                             _takes_device_tensors(), trace)
        if direct:
            try:
                self._thread_socket().send_multipart([encode_header(message), *frames])
            except LinkClosed as exc:
                self.forget(call_id)
                raise _link_lost(exc) from None
        else:
            self._post([encode_header(message), *frames])
        return call_id, call

    def _device_input(self, name: str, array: Any) -> TensorRef:
        """A device input goes by CUDA IPC handle (the callee opens it in place); this worker keeps the
        memory until the call ends. Memory it got from another worker goes on under that owner."""
        from . import device
        from .wire.cuda_ipc import CudaIpcError

        source = array.ref
        if source is not None:
            region, offset, owner = source.region, source.offset, source.owner
        else:
            try:
                region, offset = device.export(array)
            except CudaIpcError as exc:
                raise InferdError(ErrorCode.INTERNAL, "BLS input '%s': %s" % (name, exc)) from None
            owner = ""  # the caller itself: the supervisor knows who that is
            self._own_device[(region, offset)] = array
        return TensorRef(name, array.datatype, list(array.shape), "cuda", -1, region, offset, array.nbytes,
                         array.device, owner)

    def wait_direct(self, call_id: int, timeout_s: Optional[float]) -> BlsReply:
        """The reply of a call sent with `direct=True`, read on this thread's socket: no hand-off to
        the socket thread and back (two thread wake-ups per call). Raises InferdError on timeout."""
        sock = self._thread_socket()
        timeout_ms = -1 if timeout_s is None else int(timeout_s * 1000)
        while True:
            try:
                parts = sock.recv_multipart(block=False)
            except LinkClosed as exc:
                self.forget(call_id)
                raise _link_lost(exc) from None
            if parts is None:
                if not sock.poll(timeout_ms):
                    self.cancel(call_id)
                    self.forget(call_id)
                    raise InferdError(ErrorCode.UNAVAILABLE, "Request timeout expired")
                continue
            try:
                message, data = decode(parts)
            except Exception:
                continue  # the supervisor sent something odd: keep waiting (the timeout still applies)
            if type(message) is not BlsResponse:
                continue
            try:
                reply = self._replies.read(message, data)
            except InferdError as exc:
                reply = BlsReply([], exc, {}, True)
            if message.call_id == call_id:
                self.forget(call_id)
                return reply
            # a late reply to a call this thread gave up on: its arrays are dropped, leases released

    def _thread_socket(self) -> DealerSocket:
        """This thread's own socket (ZMTP spoken by the thread itself: no I/O-thread hand-offs)."""
        sock = getattr(self._local, "sock", None)
        if sock is None:
            if self._closed:
                raise InferdError(ErrorCode.UNAVAILABLE, "the worker is shutting down")
            with self._lock:
                n = next(self._socket_ids)
            try:
                sock = DealerSocket(self._endpoint, ("%s/%d" % (self._identity, n)).encode())
            except LinkClosed as exc:
                raise _link_lost(exc) from None
            self._local.sock = sock
            with self._lock:
                self._thread_sockets.append(sock)
        return sock

    def cancel(self, call_id: int) -> None:
        """The caller gave up (timeout, iterator dropped): the supervisor cancels the request."""
        self._post([encode_header(BlsCancel(call_id))])

    def control(self, op: str, model_name: str, model_version: str = "", config: str = "",
                files: Optional[dict[str, bytes]] = None, unload_dependents: bool = False) -> Any:
        """load / unload / ready: blocks until the supervisor answers; returns ModelControlResult."""
        call = _Call(False)
        with self._lock:
            call_id = next(self._ids)
            self._calls[call_id] = call
        names = sorted(files or {})
        message = ModelControl(call_id, op, model_name, model_version, config, names, bool(unload_dependents))
        self._post([encode_header(message), *[bytes((files or {})[n]) for n in names]])
        assert call.future is not None
        return call.future.result()

    def forget(self, call_id: int) -> None:
        with self._lock:
            call = self._calls.pop(call_id, None)
        if call is not None and not call.done:
            call.done = True
            self._arena.give_back(call.regions)
            call.device.clear()

    def close(self) -> None:
        self._closed = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with self._lock:  # at exit: the threads that own these are done with them
            for sock in self._thread_sockets:
                sock.close()
            self._thread_sockets.clear()
        self._arena.close()

    # ---- the socket thread ------------------------------------------------------------------------

    def _post(self, frames: list[Any]) -> None:
        if self._closed:
            raise InferdError(ErrorCode.UNAVAILABLE, "the worker is shutting down")
        with self._lock:
            self._outgoing.append(frames)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="inferd-bls", daemon=True)
                self._thread.start()
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass  # full: a wake-up is pending anyway

    def _serve(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self._identity.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._closed:
                poller.poll()
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except OSError:
                    pass
                while self._outgoing:
                    sock.send_multipart(self._outgoing.popleft(), copy=False)
                while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    self._on_reply(sock.recv_multipart(copy=False))
        finally:
            sock.close(linger=0)

    def _on_reply(self, frames: list[Any]) -> None:
        try:
            message, data = decode(frames)
        except Exception:
            return  # the supervisor sent something odd: the caller's timeout (if any) still applies
        with self._lock:
            call = self._calls.get(message.call_id)
        if type(message) is ModelControlResult:
            if call is not None and call.future is not None:
                self.forget(message.call_id)
                call.future.set_result(message)
            return
        if type(message) is not BlsResponse:
            return
        try:
            reply = self._replies.read(message, data)
        except InferdError as exc:
            reply = BlsReply([], exc, {}, True)
        if call is None:
            return  # given up on (timeout): leases it held were released by the GC already
        if reply.final:
            self.forget(message.call_id)
        if call.stream is not None:
            call.stream.put(reply)
            if reply.final:
                call.stream.put(_END)
        elif call.future is not None and not call.future.done():
            call.future.set_result(reply)

    def _release_now(self, lease: int) -> None:
        self._post([encode_header(BlsRelease([lease]))])

    def _release_later(self, lease: int) -> None:
        if not self._closed:
            try:
                self._post([encode_header(BlsRelease([lease]))])
            except InferdError:
                pass

    def stream(self, call: _Call, timeout_s: Optional[float]) -> Any:
        """Iterate a decoupled call's replies (the last is final)."""
        assert call.stream is not None
        while True:
            try:
                item = call.stream.get(timeout=timeout_s)
            except queue.Empty:
                raise InferdError(ErrorCode.UNAVAILABLE, "Request timeout expired") from None
            if item is _END:
                return
            yield item


_client: Optional[BlsClient] = None
_settings: Optional[tuple[zmq.Context, str, str]] = None
_client_lock = threading.Lock()


def configure(context: zmq.Context, endpoint: str, identity: str) -> None:
    """Worker start-up: where BLS calls go (the client itself starts on the first call)."""
    global _settings
    _settings = (context, endpoint, identity)


def client() -> BlsClient:
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                if _settings is None:
                    raise InferdError(ErrorCode.UNAVAILABLE, "BLS is only available inside a model served by inferd")
                _client = BlsClient(*_settings)
    return _client


def shutdown() -> None:
    """Worker exit: close the socket (before the ZeroMQ context ends) and unlink our regions."""
    if _client is not None:
        _client.close()


_device_capable: Optional[bool] = None


def _takes_device_tensors() -> bool:
    """Whether this worker could open a device output (a GPU and a CUDA library to reach it), decided
    without importing the library: a CPU-only environment gets BLS outputs in host memory."""
    global _device_capable
    if _device_capable is None:
        import importlib.util

        def findable(name: str) -> bool:
            try:
                return importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                return False

        _device_capable = os.path.exists("/dev/nvidiactl") and any(
            name in sys.modules or findable(name) for name in ("cuda.bindings", "cuda", "cupy", "torch"))
    return _device_capable


def _wire_bytes(datatype: str, array: np.ndarray) -> memoryview:
    if datatype == "BYTES":
        return memoryview(bytes_codec.serialize(array))
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")  # type: ignore[arg-type]
