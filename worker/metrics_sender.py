"""Sends what changed in the models' custom metrics (metric_registry.Registry) as a MetricsReport on
the worker's own "<identity>/metrics" socket, opened when the first report is due (a worker whose
model makes no metrics never opens it).

`flush()` runs on the heartbeat thread once per interval, and on the main or execute thread just before
a LoadResult or an execute's results leave: the report is then written before the answer, so a
/metrics scrape made after the call returned shows what initialize or execute did (as Triton, whose
metrics live in the server process). `sync()` runs after every metric call of the model: it sends what
changed and waits until the supervisor says it applied it (MetricsAck), as python_backend's metric calls
go to the server and back, so a model that scrapes /metrics inside execute sees its own changes. Models
that make no metrics never pay for it. One lock: a ZeroMQ socket is used by one thread at a time."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Optional

import zmq

from .wire.messages import MetricsAck, MetricsReport, ProtocolError, decode, encode_header
from .wire.metric_rules import SUFFIX as METRICS_SUFFIX

SYNC_TIMEOUT_S = 5.0  # a supervisor that does not answer in time: the call returns (the next report says all)


class MetricsSender:
    def __init__(self, context: zmq.Context, endpoint: str, identity: str, registry: Any) -> None:
        self._context = context
        self._endpoint = endpoint
        self._identity = identity + METRICS_SUFFIX
        self._registry = registry
        self._sock: Optional[zmq.Socket] = None
        self._lock = threading.Lock()
        self._seqs = itertools.count(1)

    def flush(self) -> None:
        """Send the changes since the last report, if any; never raises (metrics never stop a worker)."""
        if not self._registry.pending():  # the common case, without the lock
            return
        with self._lock:
            try:
                report = self._registry.report()
                if report is None:
                    return
                header = encode_header(report)
                sock = self._socket()
            except Exception:
                return
            try:
                sock.send(header, flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # not queued (zmq.Again: the pipe is full): the next report says everything
                self._registry.resend_all()

    def sync(self) -> None:
        """Send what changed (an empty report if a flush already did: it still comes after it) and wait for
        the supervisor's MetricsAck; never raises."""
        with self._lock:
            seq = next(self._seqs)
            try:
                report = self._registry.report() or MetricsReport()
                report.ack = seq
                sock = self._socket()
                sock.send(encode_header(report), flags=zmq.NOBLOCK)
            except Exception:  # zmq.Again included: the next report says everything
                self._registry.resend_all()
                return
            deadline = time.monotonic() + SYNC_TIMEOUT_S
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    return
                try:
                    message, _ = decode(sock.recv_multipart(flags=zmq.NOBLOCK, copy=True))
                except (zmq.ZMQError, ProtocolError):
                    continue
                if isinstance(message, MetricsAck) and message.seq >= seq:
                    return

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self._identity.encode("utf-8"))
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._endpoint)
            self._sock = sock
        return self._sock

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
