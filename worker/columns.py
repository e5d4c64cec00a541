"""Batches by columns on the worker's side (wire.messages.ExecuteColumns / ExecuteResultColumns): the
requests' inputs as rows of one array per input, and the results, when they are alike, as one frame
per output. See docs/worker-protocol.md, "Batches by columns"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from .backends.base import AlikeResults, Request, Response, Tensor
from .tensors import BF16_VIEW, OutputSpec, check_output, check_shape, output_data
from .wire import dtypes
from .wire.errors import internal
from .wire.messages import ZERO_COPY_MIN_BYTES, TensorColumn

Layout = list[tuple[str, str, tuple[int, ...]]]  # per output: name, datatype, each request's shape


def input_columns(columns: Sequence[TensorColumn], frames: Sequence[memoryview], count: int) -> list[np.ndarray]:
    """Per input column, one array of shape [count] + shape over its frame (no copy): row i is request
    i's tensor."""
    arrays = []
    for column in columns:
        name = column.name
        dt = dtypes.BY_NAME.get(column.datatype) if type(column.datatype) is str else None
        if dt is None or dt.itemsize == 0:
            raise internal("input column '%s' has datatype %r, not a numeric one" % (name, column.datatype))
        shape = (count,) + check_shape(column.shape, name)
        frame = column.frame
        if type(frame) is not int or not 0 <= frame < len(frames):
            raise internal("input column '%s' refers to a missing data frame" % name)
        buf = frames[frame]
        elements = 1
        for s in shape:
            elements *= s
        if buf.nbytes != elements * dt.itemsize:
            raise internal("input column '%s': expected %d bytes for %d requests of shape %s, got %d"
                           % (name, elements * dt.itemsize, count, list(shape[1:]), buf.nbytes))
        arrays.append(np.ndarray(shape, BF16_VIEW if dt.numpy is None else dt.numpy, buf))
    return arrays


def output_columns(requests: list[Request], results: Sequence[Response], specs: dict[str, OutputSpec],
                   output_names: list[str], model: str, check: Callable[..., np.ndarray] = check_output,
                   ) -> Optional[tuple[Layout, list[bytes]]]:
    """(layout, one frame per output) when every result can go by columns: no error, no parameters, and
    the same checked outputs (name, datatype, shape; numeric, small) in the same order. None otherwise:
    the batch goes request by request, which reports the errors. `check` is the runtime's output check
    (tensors.check_output or tensors.output_as_returned)."""
    if type(results) is AlikeResults:
        found = _alike_columns(requests, results, specs, output_names, model, check)
        if found is not None:
            return found
    else:
        found = _one_output_alike(requests, results, specs, output_names, model, check)
        if found is not None:
            return found
    layout: Optional[Layout] = None
    columns: list[list[Any]] = []
    # per column, the first request's array when the checks left it as it was: a later array of the
    # same name, datatype, shape and dtype, C-contiguous, would pass them unchanged too
    unchanged: list[Optional[np.ndarray]] = []
    ndarray = np.ndarray
    try:
        for request, result in zip(requests, results):
            if result.error is not None or result.parameters:
                return None
            wanted = request.requested_outputs or output_names
            outs = result.outputs
            if len(outs) == 1 and layout is not None and len(layout) == 1:  # one output: what most models give
                out = outs[0]
                array = out.array
                first = unchanged[0]
                column_of = layout[0]
                name = out.name
                if (first is not None and name == column_of[0] and name in wanted and out.datatype == column_of[1]
                        and type(array) is ndarray and array.shape == column_of[2]
                        and array.dtype == first.dtype and array.flags.c_contiguous):
                    columns[0].append(array)
                    continue
            outs = [out for out in outs if out.name in wanted]
            if layout is None:
                layout = []
                for out in outs:
                    checked = _checked(out, specs, model, check)
                    if checked is None:
                        return None
                    layout.append(checked[:3])
                    columns.append([checked[3]])
                    unchanged.append(out.array if checked[3] is out.array else None)
                continue
            if len(outs) != len(layout):
                return None
            for out, column_of, column, first in zip(outs, layout, columns, unchanged):
                array = out.array
                if (first is not None and out.name == column_of[0] and out.datatype == column_of[1]
                        and type(array) is np.ndarray and array.shape == column_of[2]
                        and array.dtype == first.dtype and array.flags.c_contiguous):
                    column.append(array)
                    continue
                checked = _checked(out, specs, model, check)
                if checked is None or checked[:3] != column_of:
                    return None
                column.append(checked[3])
    except Exception:  # noqa: BLE001 - a failed check: the request-by-request path reports it
        return None
    return layout or [], [b"".join(column) for column in columns]


def _alike_columns(requests: list[Request], results: AlikeResults, specs: dict[str, OutputSpec],
                   output_names: list[str], model: str, check: Callable[..., np.ndarray],
                   ) -> Optional[tuple[Layout, list[bytes]]]:
    """`output_columns` of results a backend found alike (backends.base.AlikeResults): what is left to
    check is that every request wanted the output and that the checks leave the first array as it was
    (then they would leave the others too). None: the general loop decides."""
    name, arrays = results.name, results.arrays
    if not arrays:
        return None
    seen: Any = arrays  # the last list of wanted outputs found to hold `name` (requests share one)
    for request in requests:
        wanted = request.requested_outputs
        if wanted is not seen:
            if name not in (wanted or output_names):
                return None
            seen = wanted
    array0 = arrays[0]
    try:
        checked = _checked(Tensor(name, results.datatype, array0), specs, model, check)
        if checked is None or checked[3] is not array0:
            return None
        frame = b"".join(arrays)  # refuses an array that is not C-contiguous
    except Exception:  # noqa: BLE001 - a failed check or a non-contiguous array: the general loop decides
        return None
    return [checked[:3]], [frame]


def _one_output_alike(requests: list[Request], results: Sequence[Response], specs: dict[str, OutputSpec],
                      output_names: list[str], model: str, check: Callable[..., np.ndarray],
                      ) -> Optional[tuple[Layout, list[bytes]]]:
    """`output_columns` of the usual batch, in short: every result one wanted output of the same name,
    datatype, shape and dtype, the first left as it was by the checks (so the others would be too).
    None: not such a batch, and the general loop decides. Contiguity is not looked at per array: joining
    the arrays refuses one that is not C-contiguous (numpy's buffer of a plain request)."""
    if not results:
        return None
    first = results[0].outputs
    if len(first) != 1:
        return None
    out0 = first[0]
    name, datatype, array0 = out0.name, out0.datatype, out0.array
    ndarray = np.ndarray
    if type(array0) is not ndarray:
        return None
    shape, dtype = array0.shape, array0.dtype
    arrays: list[Any] = []
    append = arrays.append
    for result in results:
        if result.error is not None or result.parameters:
            return None
        outs = result.outputs
        if len(outs) != 1:
            return None
        out = outs[0]
        array = out.array
        if (out.name != name or out.datatype != datatype or type(array) is not ndarray
                or array.shape != shape or array.dtype != dtype):
            return None
        append(array)
    # alike: the rest (every request wanted it, the checks leave the first as it was) as for AlikeResults
    return _alike_columns(requests, AlikeResults(name, datatype, arrays), specs, output_names, model, check)


def _checked(out: Tensor, specs: dict[str, OutputSpec], model: str,
             check: Callable[..., np.ndarray]) -> Optional[tuple[str, str, tuple[int, ...], Any]]:
    """(name, datatype, shape, buffer) of one checked output that may go by columns (numeric, small)."""
    name, datatype = out.name, out.datatype
    if datatype == "BYTES" or type(out.array) is not np.ndarray:  # device outputs go one by one
        return None
    array = check(specs.get(name), name, datatype, out.array, model)
    shape, data, nbytes = output_data(datatype, array)
    return None if nbytes >= ZERO_COPY_MIN_BYTES else (name, datatype, shape, data)
