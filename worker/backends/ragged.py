"""Ragged batching in the framework backends (onnxruntime, pytorch), as Triton's backend library does it
(BackendInputCollector / BackendOutputResponder) for a config with `allow_ragged_batch` inputs,
`batch_input` or `batch_output` entries (docs/ragged-batching.md).

- A ragged input reaches the model as one 1-D tensor: every request's tensor flattened, one after the
  other, whatever its shape (a batch of one request too). Other inputs are concatenated along dim 0.
- Each `batch_input` is computed from the shape its `source_input` has in each request and is given to
  the model under each of its `target_name`s, as INT32 or FP32. For n requests whose source tensors have
  shapes [b_i] + s_i and e_i elements:
    BATCH_ELEMENT_COUNT                        [n]                e_1, ..., e_n
    BATCH_ACCUMULATED_ELEMENT_COUNT            [n]                e_1, e_1 + e_2, ...
    BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO  [n + 1]            0, e_1, e_1 + e_2, ...
    BATCH_MAX_ELEMENT_COUNT_AS_SHAPE           [max e_i]          only the shape tells (zeros here; Triton
                                                                  leaves the values uninitialised)
    BATCH_ITEM_SHAPE                           [sum b_i, len s]   s_i, repeated b_i times
    BATCH_ITEM_SHAPE_FLATTEN                   [sum b_i * len s]  the same, flat
- A `batch_output` target (BATCH_SCATTER_WITH_INPUT_SHAPE) goes back to request i in the shape of its
  configured dims (after a -1 batch dim when max_batch_size > 0) with every -1 taken from the shape of the
  source input in request i at the same position; its elements are read one after the other from the
  model's output. Other outputs are split by rows, b_i rows for request i.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from ..wire.errors import ErrorCode, InferdError
from . import framework
from .base import Request, Response

_TYPES = {"TYPE_INT32": np.int32, "TYPE_FP32": np.float32}
MAX_EMPTY_ITEM_ROWS = 1 << 20  # BATCH_ITEM_SHAPE rows beyond the source's element count (items of no elements)
KINDS = (
    "BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN",
)


def _count(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def batch_input_value(kind: str, dtype: Any, shapes: Sequence[Sequence[int]]) -> np.ndarray:
    """The tensor a batch_input of `kind` gives the model for requests whose source input has `shapes`."""
    counts = [_count(s) for s in shapes]
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(np.array(counts, dtype=np.int64)).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.cumsum(np.array([0] + counts, dtype=np.int64)).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts, default=0), dtype=dtype)
    if kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        if any(len(s) == 0 for s in shapes):
            raise InferdError(ErrorCode.INVALID_ARG, "%s needs a source input with a batch dimension" % kind)
        rank = len(shapes[-1]) - 1 if shapes else 0  # Triton takes it from the last request
        present = [s for s in shapes if int(s[0]) > 0]  # (a request of batch 0 adds no row)
        if any(len(s) - 1 != rank for s in present):
            raise InferdError(ErrorCode.INVALID_ARG, "%s needs the source input's rank to agree in the batch" % kind)
        rows = sum(int(s[0]) for s in present)
        if rows > max(sum(counts), MAX_EMPTY_ITEM_ROWS):
            # only items of no elements make more rows than elements: [4e9, 0] is no data and 4e9 rows
            raise InferdError(ErrorCode.INVALID_ARG, "%s: the source input's first dimensions ask for %d rows, "
                              "more than its %d elements (at most %d for items of no elements)"
                              % (kind, rows, sum(counts), MAX_EMPTY_ITEM_ROWS))
        items = np.array([s[1:] for s in present], dtype=np.int64).reshape(len(present), rank)
        value = np.repeat(items, [int(s[0]) for s in present], axis=0).astype(dtype)
        return value if kind == "BATCH_ITEM_SHAPE" else value.reshape(-1)
    raise InferdError(ErrorCode.INVALID_ARG, "unknown batch input kind '%s'" % kind)


class BatchInput:
    __slots__ = ("kind", "targets", "dtype", "source")

    def __init__(self, kind: str, targets: list[str], dtype: Any, source: str) -> None:
        self.kind = kind
        self.targets = targets
        self.dtype = dtype
        self.source = source


class RaggedPlan:
    """How one model's batches are put together and taken apart (see the module docstring)."""

    def __init__(self, model: str, batching: bool, ragged: frozenset[str], batch_inputs: list[BatchInput],
                 scatter: dict[str, tuple[str, list[int]]]) -> None:
        self.model = model
        self.batching = batching
        self.ragged = ragged
        self.batch_inputs = batch_inputs
        self.scatter = scatter  # output name -> (source input, output shape with -1s to fill)

    @classmethod
    def from_config(cls, model: str, config: dict[str, Any]) -> Optional[RaggedPlan]:
        """The plan of a config, or None when it asks for none of it. INVALID_ARG for a config the
        supervisor would have refused (the worker checks it too: it may be given any config)."""
        batching = int(config.get("max_batch_size") or 0) > 0
        inputs = {i.get("name") for i in config.get("input") or []}
        ragged = frozenset(i["name"] for i in config.get("input") or [] if i.get("allow_ragged_batch"))
        batch_inputs = []
        for entry in config.get("batch_input") or []:
            kind, sources = entry.get("kind", KINDS[0]), list(entry.get("source_input") or [])
            dtype = _TYPES.get(entry.get("data_type", ""))
            if kind not in KINDS or dtype is None or len(sources) != 1 or sources[0] not in inputs:
                raise InferdError(ErrorCode.INVALID_ARG, "model '%s': batch_input %s needs a known kind, data_type "
                                  "TYPE_INT32 or TYPE_FP32 and one configured source_input" % (model, entry))
            batch_inputs.append(BatchInput(kind, list(entry.get("target_name") or []), dtype, sources[0]))
        dims = {o.get("name"): [int(d) for d in (o.get("reshape") or {}).get("shape", o.get("dims") or [])]
                for o in config.get("output") or []}
        scatter: dict[str, tuple[str, list[int]]] = {}
        for entry in config.get("batch_output") or []:
            sources = list(entry.get("source_input") or [])
            if len(sources) != 1 or sources[0] not in inputs:
                raise InferdError(ErrorCode.INVALID_ARG, "model '%s': batch_output %s needs one configured "
                                  "source_input" % (model, entry))
            for target in entry.get("target_name") or []:
                if target not in dims:
                    raise InferdError(ErrorCode.INVALID_ARG, "model '%s': batch_output target '%s' is not a "
                                      "configured output" % (model, target))
                scatter[target] = (sources[0], ([-1] if batching else []) + dims[target])
        if not ragged and not batch_inputs and not scatter:
            return None
        return cls(model, batching, ragged, batch_inputs, scatter)

    @property
    def targets(self) -> list[str]:
        """The model inputs the server makes (batch_input target names)."""
        return [t for bi in self.batch_inputs for t in bi.targets]

    def _size(self, request: Request) -> int:
        inputs = request.inputs
        if self.batching and inputs and inputs[0].array.ndim:
            return max(int(inputs[0].array.shape[0]), 0)
        return 1

    def feeds(self, requests: list[Request],
              concat: Optional[Callable[[list[Any]], Any]] = None) -> Optional[tuple[dict[str, Any], list[int]]]:
        """({model input: tensor}, [batch size of each request]) for one run of `requests`, batch inputs
        included; None when they cannot share one run (their other inputs differ beyond dim 0, or device
        inputs without a `concat` that takes them). `concat` joins a list of arrays along dim 0."""
        names = [t.name for t in requests[0].inputs]
        for request in requests[1:]:
            if [t.name for t in request.inputs] != names:
                return None
            for t, first in zip(request.inputs, requests[0].inputs):
                if t.name not in self.ragged and (t.array.ndim == 0 or t.array.shape[1:] != first.array.shape[1:]):
                    return None
        if concat is None:
            if len(requests) > 1 and any(type(t.array) is not np.ndarray for r in requests for t in r.inputs):
                return None  # device inputs: one run per request
            concat = np.concatenate
        feeds: dict[str, Any] = {}
        for i, name in enumerate(names):
            arrays = [r.inputs[i].array for r in requests]
            if name in self.ragged:
                arrays = [a.reshape((_count(a.shape),)) for a in arrays]
            feeds[name] = arrays[0] if len(arrays) == 1 else concat(arrays)
        for bi in self.batch_inputs:
            shapes = [self._source_shape(r, bi.source, bi.targets) for r in requests]
            value = batch_input_value(bi.kind, bi.dtype, shapes)
            for target in bi.targets:
                feeds[target] = value
        return feeds, [self._size(r) for r in requests]

    def _source_shape(self, request: Request, source: str, targets: list[str]) -> tuple[int, ...]:
        for t in request.inputs:
            if t.name == source:
                return tuple(int(d) for d in t.array.shape)
        raise InferdError(ErrorCode.INVALID_ARG, "model '%s': batch input %s is computed from input '%s', which "
                          "request '%s' does not have" % (self.model, targets, source, request.id))

    def split(self, requests: list[Request], outputs: list[tuple[str, Any]], sizes: list[int],
              all_outputs: list[str]) -> list[Response]:
        """One Response per request: batch_output targets scattered by their source input's shape, the
        other outputs split by rows."""
        parts: list[list[tuple[str, Any]]] = [[] for _ in requests]
        total = sum(sizes)
        for name, array in outputs:
            if name in self.scatter:
                for i, part in enumerate(self._scatter(name, array, requests)):
                    parts[i].append((name, part))
            elif len(requests) == 1:
                parts[0].append((name, array))
            elif array.ndim == 0 or array.shape[0] != total:
                raise InferdError(ErrorCode.INTERNAL, "output '%s' has %s rows for a batch of %d"
                                  % (name, array.shape[0] if array.ndim else "no", total))
            else:
                start = 0
                for i, size in enumerate(sizes):
                    parts[i].append((name, array[start:start + size]))
                    start += size
        responses = []
        for request, part in zip(requests, parts):
            wanted = request.requested_outputs or all_outputs
            responses.append(Response([framework.output_tensor(n, a) for n, a in part if n in wanted]))
        return responses

    def _scatter(self, name: str, array: Any, requests: list[Request]) -> list[Any]:
        source, dims = self.scatter[name]
        available = _count(array.shape)
        flat = array.reshape((available,))
        out = []
        offset = 0
        for request in requests:
            shape = self._source_shape(request, source, [name])
            if len(shape) < len(dims):
                raise InferdError(ErrorCode.INTERNAL, "batch output '%s' has shape %s, which input '%s' of shape %s "
                                  "cannot fill" % (name, dims, source, list(shape)))
            target = [shape[j] if d == -1 else d for j, d in enumerate(dims)]
            count = _count(target)
            if offset + count > available:
                raise InferdError(ErrorCode.INTERNAL, "batch output '%s' of model '%s' has %d elements, fewer than "
                                  "the requests' input '%s' shapes ask for" % (name, self.model, available, source))
            out.append(flat[offset:offset + count].reshape(tuple(target)))
            offset += count
        return out
