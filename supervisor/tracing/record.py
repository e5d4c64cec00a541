"""One request's trace: Triton's timestamps (steady clock = time.monotonic_ns, as Triton's trace files
use), its ids and, at level TENSORS, its input and output tensors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from inferd.worker.wire.dtypes import BY_NAME

# An ensemble step or BLS call whose parent request is not traced: never sampled on its own (Triton
# traces such children only through their parent).
UNTRACED = object()
_MAX_TENSOR_TEXT = 1 << 20  # a traced tensor's text is cut here (a trace file must not hold gigabytes)


class Trace:
    __slots__ = ("id", "model_name", "model_version", "request_id", "parent", "stamps", "tensors",
                 "tensors_on", "remote_parent", "children", "sink", "instance", "ended")

    def __init__(self, trace_id: int, model_name: str, model_version: str, request_id: str, parent: Trace | None,
                 tensors_on: bool, sink: Callable[[Trace], None], remote_parent: str = "") -> None:
        self.id = trace_id
        self.model_name = model_name
        self.model_version = model_version
        self.request_id = request_id
        self.parent = parent  # an ensemble's or BLS caller's trace
        self.remote_parent = remote_parent  # a W3C traceparent the client sent (opentelemetry mode)
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[tuple[str, str, str, str, str]] = []  # activity, name, data, shape, dtype
        self.tensors_on = tensors_on
        self.children: list[Trace] = []
        self.sink = sink
        self.instance = ""
        self.ended = False
        if parent is not None:
            parent.children.append(self)

    def stamp(self, name: str, ns: int) -> None:
        self.stamps.append((name, ns))

    def tensor(self, activity: str, name: str, datatype: str, shape: Any, data: Any) -> None:
        self.tensors.append((activity, name, tensor_text(datatype, shape, data), ",".join(map(str, shape)),
                             datatype))

    def computed(self, start_ns: int, end_ns: int, result: Any, instance: str) -> None:
        """COMPUTE_* from a batch's result: the worker measures its input, infer and output durations;
        the batch ends when its result is read here, and started no earlier than it was sent."""
        input_ns, infer_ns, output_ns = result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns
        start = max(start_ns, end_ns - (input_ns + infer_ns + output_ns))
        input_end = min(end_ns, start + input_ns)
        self.instance = instance
        self.stamps += [("COMPUTE_START", start), ("COMPUTE_INPUT_END", input_end),
                        ("COMPUTE_OUTPUT_START", max(input_end, end_ns - output_ns)), ("COMPUTE_END", end_ns)]

    def end(self, ns: int, response: Any = None) -> None:
        if self.ended:
            return
        self.ended = True
        if self.tensors_on and response is not None:
            for t in getattr(response, "outputs", ()):  # a decoupled execution's result has none here
                self.tensor("TENSOR_BACKEND_OUTPUT", t.name, t.datatype, t.shape, t.data)
        if self.parent is None:  # the frontend's response (Triton writes none for an ensemble step)
            self.stamp("INFER_RESPONSE_COMPLETE", ns)
        self.stamp("REQUEST_END", ns)
        self.sink(self)


def tensor_text(datatype: str, shape: Any, data: Any) -> str:
    """The values comma-separated, as Triton writes them ("1,2,3")."""
    try:
        if datatype == "BYTES":
            from inferd.worker.wire.bytes_codec import deserialize  # only at level TENSORS
            items = deserialize(memoryview(data)).tolist()
            text = ",".join(b.decode("utf-8", "replace") for b in items)
        else:
            dt = BY_NAME[datatype]
            arr = np.frombuffer(memoryview(data), dtype=dt.numpy)
            if arr.dtype.kind == "f":  # as C++ streams print them (Triton): 1, 0.5, 1e+10
                text = ",".join("%g" % x for x in arr.tolist())
            else:
                text = ",".join(str(int(x)) for x in arr.tolist())
    except Exception:  # device memory, an odd buffer: the trace says so instead of failing the request
        return "<not readable>"
    return text if len(text) <= _MAX_TENSOR_TEXT else text[:_MAX_TENSOR_TEXT] + "..."


def watch_batch(future: asyncio.Future[Any], requests: Sequence[Any], instance: str, start: int) -> None:
    """The COMPUTE_* timestamps of the traced requests of a batch sent to `instance` at `start`."""
    traces = [r.trace for r in requests if r.trace is not None]
    if not traces:
        return

    def done(f: asyncio.Future[Any]) -> None:
        if f.cancelled() or f.exception() is not None:
            return
        end, result = time.monotonic_ns(), f.result()
        for trace in traces:
            trace.computed(start, end, result, instance)

    future.add_done_callback(done)
