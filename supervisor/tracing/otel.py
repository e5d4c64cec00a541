"""Mode `opentelemetry`: each traced request exported as spans over OTLP/HTTP with the OpenTelemetry SDK
(imported only in this mode: `pip install inferd[tracing]`).

The spans are Triton 2.51's (checked against it here): a top-level `InferRequest` span (event
INFER_RESPONSE_COMPLETE), a child span named after the model (attributes triton.model_name, model_version,
request_id, trace_id, trace_parent_id; events REQUEST_START, QUEUE_START, REQUEST_END) and under it a
`compute` span (events COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END); ensemble steps
and BLS calls are model spans under their parent's model span. inferd adds a `queue` span
(QUEUE_START..COMPUTE_START) beside `compute`. All are SERVER spans of scope `triton-server`. A client's
W3C traceparent makes `InferRequest` a child of the client's span. Timestamps are the steady clock's, moved
onto the wall clock OpenTelemetry uses.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .options import TraceOptions
from .record import Trace


class OtelExporter:
    def __init__(self, options: TraceOptions) -> None:
        self._provider = TracerProvider(resource=Resource.create(dict(options.otel_resource)))
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=url if "://" in (url := options.otel_url) else "http://" + url),
            max_queue_size=options.bsp_max_queue_size,
            schedule_delay_millis=options.bsp_schedule_delay_ms,
            max_export_batch_size=options.bsp_max_export_batch_size))
        self._tracer = self._provider.get_tracer("triton-server")
        self._propagator = TraceContextTextMapPropagator()
        self._wall_offset = time.time_ns() - time.monotonic_ns()

    def export(self, trace: Trace) -> None:
        """A finished root trace and its children become spans (the batch processor sends them)."""
        context = None
        if trace.remote_parent:
            context = self._propagator.extract({"traceparent": trace.remote_parent})
        stamps = dict(trace.stamps)
        wall = self._wall_offset
        start = stamps.get("REQUEST_START", 0) + wall
        end = stamps.get("REQUEST_END", stamps.get("REQUEST_START", 0)) + wall
        top = self._tracer.start_span("InferRequest", context=context, kind=SpanKind.SERVER, start_time=start)
        if "INFER_RESPONSE_COMPLETE" in stamps:
            top.add_event("INFER_RESPONSE_COMPLETE", timestamp=stamps["INFER_RESPONSE_COMPLETE"] + wall)
        self._model_span(trace, otel_trace.set_span_in_context(top))
        top.end(end_time=end)

    def _model_span(self, trace: Trace, context: Any) -> None:
        stamps = dict(trace.stamps)
        wall = self._wall_offset
        start = stamps.get("REQUEST_START", 0) + wall
        end = stamps.get("REQUEST_END", stamps.get("REQUEST_START", 0)) + wall
        version = int(trace.model_version) if trace.model_version.isdigit() else trace.model_version
        span = self._tracer.start_span(
            trace.model_name, context=context, kind=SpanKind.SERVER, start_time=start,
            attributes={"triton.model_name": trace.model_name, "triton.model_version": version,
                        "triton.request_id": trace.request_id, "triton.trace_id": trace.id,
                        "triton.trace_parent_id": trace.parent.id if trace.parent is not None else 0,
                        **({"inferd.instance": trace.instance} if trace.instance else {})})
        for name, ns in trace.stamps:
            if name in ("REQUEST_START", "QUEUE_START", "REQUEST_END"):
                span.add_event(name, timestamp=ns + wall)
        inner = otel_trace.set_span_in_context(span)
        if "QUEUE_START" in stamps and "COMPUTE_START" in stamps:
            queue = self._tracer.start_span("queue", context=inner, kind=SpanKind.SERVER,
                                            start_time=stamps["QUEUE_START"] + wall)
            queue.end(end_time=stamps["COMPUTE_START"] + wall)
        if "COMPUTE_START" in stamps and "COMPUTE_END" in stamps:
            compute = self._tracer.start_span("compute", context=inner, kind=SpanKind.SERVER,
                                              start_time=stamps["COMPUTE_START"] + wall)
            for name in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"):
                compute.add_event(name, timestamp=stamps[name] + wall)
            compute.end(end_time=stamps["COMPUTE_END"] + wall)
        for child in trace.children:
            self._model_span(child, inner)
        span.end(end_time=end)

    def shutdown(self) -> None:
        self._provider.shutdown()  # the spans still queued are sent first
