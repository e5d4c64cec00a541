"""A model's own readiness check, `is_ready()` (python_backend after Triton 2.51), answered on the worker's
`<identity>/ready` socket. Only a model that defines it gets the socket: others pay nothing.

The supervisor sends a `ReadinessProbe(seq)` when a client asks whether the model is ready and waits for the
`ReadinessResult(seq, ready, error)`, at most five seconds (python_backend's timeout). The socket thread
answers; the check itself runs on a thread of its own, as the stub runs it beside `execute`, so a slow
`is_ready()` neither blocks executions nor keeps the socket thread from stopping: the supervisor stops
waiting, the check runs to its end, and its answer then goes out (the supervisor keeps it for the next
readiness request, as Triton reuses an in-flight check's result). One check at a time; a probe that comes
while one runs gets that check's answer.

Runs on Python 3.9+ (pyzmq, stdlib only).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Optional

import zmq

from .wire.errors import ErrorCode, InferdError
from .wire.messages import ProtocolError, ReadinessProbe, ReadinessResult, WireError, decode, encode_header

READY_SUFFIX = "/ready"


def run_check(check: Callable[[], bool]) -> ReadinessResult:
    """The check's answer as a ReadinessResult (seq 0): its bool, or the error it raised."""
    try:
        ready = check()
    except InferdError as exc:
        return ReadinessResult(ready=False, error=WireError(int(exc.code), exc.message))
    except BaseException as exc:  # noqa: BLE001 - whatever the model raised is its answer: not ready
        return ReadinessResult(ready=False, error=WireError(int(ErrorCode.INTERNAL), "%s: %s" % (
            type(exc).__name__, exc)))
    return ReadinessResult(ready=ready)


class ReadinessResponder(threading.Thread):
    def __init__(self, context: zmq.Context, endpoint: str, identity: str, check: Callable[[], bool],
                 log: Optional[Callable[[str], None]] = None) -> None:
        super().__init__(name="inferd-readiness", daemon=True)
        self._context = context
        self._endpoint = endpoint
        self._identity = identity + READY_SUFFIX
        self._check = check
        self._log = log or (lambda message: None)
        self._lock = threading.Lock()
        self._waiting: list[int] = []  # seqs of the probes the running check answers
        self._answer: Optional[ReadinessResult] = None  # the finished check's answer, not sent yet
        self._checking = False
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def stop(self) -> None:
        """Close the socket soon (a check still running finishes on its own daemon thread, unanswered)."""
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # the pipe is full (a wake-up is pending) or closed
            pass

    def run(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self._identity.encode("utf-8"))
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._endpoint)
        try:
            sock.send(encode_header(ReadinessResult()), flags=zmq.NOBLOCK)  # seq 0: the socket is open
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            while not self._stopping:
                events = dict(poller.poll())
                if sock in events:
                    self._read(sock)
                if self._wake_r in events:
                    self._drain_pipe()
                self._send_answer(sock)
        except zmq.ZMQError as exc:  # the context is ending with the worker
            if not self._stopping:
                self._log("readiness socket failed: %s" % exc)
        finally:
            sock.close(linger=0)
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _read(self, sock: zmq.Socket) -> None:
        while True:
            try:
                parts = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message, _ = decode(parts)
            except ProtocolError as exc:
                self._log("readiness socket: %s" % exc)
                continue
            if isinstance(message, ReadinessProbe) and type(message.seq) is int:
                self._probe(message.seq)

    def _probe(self, seq: int) -> None:
        with self._lock:
            self._waiting.append(seq)
            if self._checking:
                return  # the running check answers this probe too
            self._checking = True
        threading.Thread(target=self._run_check, name="inferd-is-ready", daemon=True).start()

    def _run_check(self) -> None:
        answer = run_check(self._check)
        with self._lock:
            self._answer = answer
            self._checking = False
        self._wake()

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:  # empty (BlockingIOError) or closed
            pass

    def _send_answer(self, sock: zmq.Socket) -> None:
        with self._lock:
            answer, self._answer = self._answer, None
            if answer is None:
                return
            seqs, self._waiting = self._waiting, []
        for seq in seqs:
            try:
                sock.send(encode_header(ReadinessResult(seq, answer.ready, answer.error)), flags=zmq.NOBLOCK)
            except zmq.Again:  # the supervisor is not reading: its own timeout says not ready
                pass
