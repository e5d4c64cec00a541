"""Mode `triton`: traces written as Triton 2.51 writes them, one JSON array of records per file.

Per trace: `{"id","model_name","model_version","request_id"[,"parent_id"]}`, then one
`{"id","timestamps":[{"name","ns"}]}` per timestamp and, at level TENSORS, one `{"id","activity","tensor"}`
per tensor. With log_frequency N every N traces go to `<file>.<k>` (k = 0, 1, ...), each a complete
array; with 0 they go to `<file>`, one array closed when the server stops (as Triton; written out every
_BUFFERED traces so memory stays bounded). Files are written on one background thread, in order.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .record import Trace

log = logging.getLogger("inferd.trace")
_BUFFERED = 1000  # traces held before they are written when log_frequency is 0
_BUFFERED_BYTES = 16 << 20  # ... or once their tensors' text reaches this (level TENSORS)
_RANK = {name: i for i, name in enumerate((
    "REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "COMPUTE_START", "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"))}


def records(trace: Trace) -> list[dict[str, Any]]:
    """The records of `trace` in Triton's order: its children (finished first) before it, then the head,
    REQUEST_START, QUEUE_START, the inputs, the outputs, INFER_RESPONSE_COMPLETE, COMPUTE_*, REQUEST_END."""
    out: list[dict[str, Any]] = []
    for child in trace.children:  # ensemble steps and BLS calls, written with their root
        out += records(child)
    head: dict[str, Any] = {"id": trace.id, "model_name": trace.model_name,
                            "model_version": int(trace.model_version) if trace.model_version.isdigit()
                            else trace.model_version, "request_id": trace.request_id}
    if trace.parent is not None:
        head["parent_id"] = trace.parent.id
    out.append(head)
    stamps = sorted(trace.stamps, key=lambda s: _RANK.get(s[0], len(_RANK)))
    tensors = [_tensor(trace.id, t) for t in trace.tensors]  # the inputs, then the outputs
    for name, ns in stamps:
        if name in ("INFER_RESPONSE_COMPLETE", "COMPUTE_START", "REQUEST_END"):
            out += tensors
            tensors = []
        out.append({"id": trace.id, "timestamps": [{"name": name, "ns": ns}]})
    return out + tensors


def _tensor_bytes(trace: Trace) -> int:
    return sum(len(t[2]) for t in trace.tensors) + sum(_tensor_bytes(c) for c in trace.children)


def _tensor(trace_id: int, t: tuple[str, str, str, str, str]) -> dict[str, Any]:
    activity, name, data, shape, dtype = t
    return {"id": trace_id, "activity": activity, "tensor": {"name": name, "data": data, "shape": shape,
                                                             "dtype": dtype}}


class TraceFileWriter:
    def __init__(self, path: str, log_frequency: int) -> None:
        self.path = path
        self.log_frequency = log_frequency
        self._pending: list[Trace] = []
        self._pending_bytes = 0
        self._index = 0
        self._main_open = False  # `<path>` holds "[" and records, "]" still to come
        self._lock = threading.Lock()  # the main file, between the writer thread and close()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferd-trace")

    def add(self, trace: Trace) -> None:
        self._pending.append(trace)
        self._pending_bytes += _tensor_bytes(trace)
        if self.log_frequency:
            if len(self._pending) >= self.log_frequency:
                self.flush()
        elif len(self._pending) >= _BUFFERED or self._pending_bytes >= _BUFFERED_BYTES:
            self.flush()

    def set_frequency(self, log_frequency: int) -> None:
        """A settings change writes out what was collected under the old one (as Triton does)."""
        if log_frequency != self.log_frequency:
            self.flush()
            self.log_frequency = log_frequency

    def flush(self) -> None:
        if not self._pending:
            return
        batch = [r for t in self._pending for r in records(t)]
        self._pending = []
        self._pending_bytes = 0
        if self.log_frequency:
            path = "%s.%d" % (self.path, self._index)
            self._index += 1
            self._pool.submit(self._write_whole, path, batch)
        else:
            self._pool.submit(self._append_main, batch)

    def close(self) -> None:
        """At shutdown: everything collected written, the main file's array closed."""
        self.flush()
        self._pool.shutdown(wait=True)
        with self._lock:
            if self._main_open:
                self._write(self.path, "]", "a")
                self._main_open = False

    def _write_whole(self, path: str, batch: list[dict[str, Any]]) -> None:
        self._write(path, json.dumps(batch, separators=(",", ":")), "w")

    def _append_main(self, batch: list[dict[str, Any]]) -> None:
        text = json.dumps(batch, separators=(",", ":"))[1:-1]
        with self._lock:
            self._write(self.path, ("," if self._main_open else "[") + text, "a" if self._main_open else "w")
            self._main_open = True

    @staticmethod
    def _write(path: str, text: str, mode: str) -> None:
        try:
            with open(path, mode, encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:  # a full disk must not take the server down
            log.error("cannot write trace file %s: %s", path, exc)
