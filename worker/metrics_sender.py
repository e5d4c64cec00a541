"""Sends what changed in the models' custom metrics (custom_metrics.Registry) as a MetricsReport on
the worker's own "<identity>/metrics" socket, opened when the first report is due (a worker whose
model makes no metrics never opens it).

`flush()` runs on the heartbeat thread once per interval, and on the main or execute thread just before
a LoadResult or an execute's results leave: the report is then written before the answer, so a
/metrics scrape made after the call returned shows what initialize or execute did (as Triton, whose
metrics live in the server process). One lock: a ZeroMQ socket is used by one thread at a time."""

from __future__ import annotations

import threading
from typing import Any, Optional

import zmq

from .wire.custom_metrics import SUFFIX as METRICS_SUFFIX
from .wire.messages import encode_header


class MetricsSender:
    def __init__(self, context: zmq.Context, endpoint: str, identity: str, registry: Any) -> None:
        self._context = context
        self._endpoint = endpoint
        self._identity = identity + METRICS_SUFFIX
        self._registry = registry
        self._sock: Optional[zmq.Socket] = None
        self._lock = threading.Lock()

    def flush(self) -> None:
        """Send the changes since the last report, if any; never raises (metrics never stop a worker)."""
        if not self._registry.pending():  # the common case, without the lock
            return
        with self._lock:
            try:
                report = self._registry.report()
                if report is None:
                    return
                if self._sock is None:
                    sock = self._context.socket(zmq.DEALER)
                    sock.setsockopt(zmq.IDENTITY, self._identity.encode("utf-8"))
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(self._endpoint)
                    self._sock = sock
                header = encode_header(report)
            except Exception:
                return
            try:
                self._sock.send(header, flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # not queued (zmq.Again: the pipe is full): the next report says everything
                self._registry.resend_all()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
