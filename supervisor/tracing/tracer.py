"""Which requests are traced, and where their traces go.

Sampling follows Triton: a request is traced when its model's settings (tracing/settings.py) have a level
other than OFF, every `trace_rate`-th request (counted per settings owner: the model where it has its own
settings, else the global ones), while `trace_count` is not used up (-1: no limit; each trace counts it
down). Ensemble steps and BLS calls of a traced request are traced with it, as its children; an
OpenTelemetry context the client sent (W3C traceparent) is traced regardless of rate and count.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from . import live
from .options import TraceOptions
from .record import UNTRACED, Trace
from .settings import TraceSettings

log = logging.getLogger("inferd.trace")


class Tracer:
    def __init__(self, options: TraceOptions) -> None:
        self.options = options
        self.mode = options.mode
        self.settings = TraceSettings(
            defaults={"trace_level": options.level, "trace_rate": options.rate, "trace_count": options.count,
                      "log_frequency": options.log_frequency, "trace_file": options.file},
            mode=options.mode,
            shown={"url": options.otel_url, "bsp_schedule_delay": str(options.bsp_schedule_delay_ms),
                   "bsp_max_export_batch_size": str(options.bsp_max_export_batch_size),
                   "bsp_max_queue_size": str(options.bsp_max_queue_size)})
        self._ids = itertools.count(1)
        self._samples: dict[str, int] = {}
        self._inflight: dict[int, Trace] = {}  # traces begun, not ended (by id): BLS calls find their parent
        self._file: Any = None
        self._otel: Any = None
        if options.mode == "opentelemetry":
            from .otel import OtelExporter  # the SDK is imported only in this mode
            self._otel = OtelExporter(options)
            self._sink = self._otel.export
        else:
            from .trace_file import TraceFileWriter
            self._file = TraceFileWriter(options.file, options.log_frequency) if options.file else None
            self._sink = self._file.add if self._file is not None else _drop
        self.rearm()

    # ---- settings ----
    def update(self, model: str, update: dict[str, Any]) -> None:
        self.settings.update(model, update)
        if self._file is not None:
            self._file.set_frequency(int(self.settings.effective()["log_frequency"]))
        self.rearm()

    def rearm(self) -> None:
        live.armed = bool(self._inflight) or self.settings.any_on()

    def close(self) -> None:
        live.armed = False
        if self._file is not None:
            self._file.close()
        if self._otel is not None:
            self._otel.shutdown()

    # ---- per request (only while live.armed) ----
    def begin(self, model_name: str, model_version: str, request: Any) -> bool:
        """Whether `request` is traced; if so its trace (request.trace) has REQUEST_START, QUEUE_START
        and, at level TENSORS, its inputs."""
        parent = request.trace_parent
        if parent is UNTRACED:
            return False
        values = self.settings.effective(model_name)
        if values["trace_level"] == ("OFF",):
            return False
        if isinstance(parent, Trace):
            trace = Trace(next(self._ids), model_name, model_version, request.id, parent, parent.tensors_on,
                          self._ended)
        else:
            remote = parent if isinstance(parent, str) and self._otel is not None else ""
            if not remote and not self._sample(model_name, values):
                return False
            trace = Trace(next(self._ids), model_name, model_version, request.id, None,
                          "TENSORS" in values["trace_level"], self._ended, remote)
        now = time.monotonic_ns()
        trace.stamp("REQUEST_START", min(request.arrival_ns, now))
        trace.stamp("QUEUE_START", now)
        if trace.tensors_on:
            for t in request.inputs:
                trace.tensor("TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, t.data)
        request.trace = trace
        self._inflight[trace.id] = trace
        return True

    def trace_of(self, context: str) -> Any:
        """The trace in flight a BLS call names (pb_utils request.trace()), else UNTRACED."""
        if context and context.isdigit() and len(context) < 20:
            trace = self._inflight.get(int(context))
            if trace is not None:
                return trace
        return UNTRACED

    def _ended(self, trace: Trace) -> None:
        """A root trace goes to the sink with its children (ensemble steps, BLS calls) inside it."""
        self._inflight.pop(trace.id, None)
        if trace.parent is None:
            self._sink(trace)
        if not self._inflight:
            self.rearm()

    def _sample(self, model_name: str, values: dict[str, Any]) -> bool:
        rate, count = values["trace_rate"], values["trace_count"]
        if rate == 0 or count == 0:
            return False
        owner = self.settings.owner(model_name)
        n = self._samples.get(owner, 0) + 1
        self._samples[owner] = n
        if n % rate:
            return False
        if count > 0:
            self.settings.count_down(model_name)
        return True

    @staticmethod
    def abandon(request: Any) -> None:
        """The request was refused before it was queued: its trace ends now (and stops counting as in flight)."""
        request.trace.end(time.monotonic_ns())

    def submit(self, model_name: str, model_version: str, request: Any,
               submit: Callable[[Any], asyncio.Future[Any]]) -> asyncio.Future[Any]:
        """`submit(request)`, traced when the request is sampled: a refusal ends its trace at once, else the
        trace ends with the answer."""
        if not self.begin(model_name, model_version, request):
            return submit(request)
        try:
            future = submit(request)
        except BaseException:
            self.abandon(request)
            raise
        self.watch(request.trace, future)
        return future

    @staticmethod
    def watch(trace: Trace, future: asyncio.Future[Any]) -> None:
        """REQUEST_END (and the outputs) when the request's answer is ready."""
        future.add_done_callback(lambda f: trace.end(
            time.monotonic_ns(), None if f.cancelled() or f.exception() is not None else f.result()))


def _drop(trace: Trace) -> None:
    pass

