"""Triton's classification extension (reference/triton.md §1.6): an output requested with the parameter
`classification: k` comes back as a BYTES tensor of its top k entries instead of its values.

What Triton 2.51 does, as observed (and done here):
- each entry is b"<value>:<index>", plus b":<label>" when the output's `label_filename` gives a
  non-empty label on line <index> (0-based) of that file; the value is C's "%f" for floating point
  outputs ("0.900000", "-0.000000") and the plain integer otherwise;
- a model with max_batch_size > 0: one row per batch item, shape [batch, min(k, items per row)];
  without batching the whole tensor (any rank) is one row, shape [min(k, element count)];
- highest value first, equal values in index order (Triton's std::sort keeps that order up to 16
  elements; beyond it its order among equal values is its sort's, not reproduced here);
- k is read as an unsigned 32-bit number (2**32 + 2 is 2), and 0 leaves the output as it is;
- BOOL, FP16, BF16 and BYTES outputs are refused with Triton's message (Triton 2.51 dies on BYTES);
- a label file that cannot be read fails the model's load.
NaN, which Triton's sort leaves wherever it falls, ranks below every number here.

Labels are read once per load (`load_labels`, kept on the ModelVersion); a request without the
parameter costs one look at its requested outputs' parameters (`requested`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import internal, invalid_arg

from ..inference.tensors import element_count, pack_bytes
from ..inference.types import InferResponse, RequestedOutput, Tensor

PARAM = "classification"
CLASSIFICATION_WITH_SHM = "Output can't set both 'shared_memory_region' and 'classification'"  # Triton's words
MAX_LABEL_FILE_BYTES = 64 << 20
SUPPORTED = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"))

Labels = dict[str, tuple[bytes, ...]]  # output name -> its labels, line i = class i


# ---------------------------------------------------------------- once per load

def load_labels(model_dir: str, config: dict[str, Any]) -> Labels:
    """The labels of every output of `config` (Triton JSON rendering) that names a `label_filename`."""
    labels: Labels = {}
    for out in config.get("output") or ():
        filename = out.get("label_filename")
        if filename:
            labels[out["name"]] = read_labels(model_dir, filename, out["name"])
    return labels


def read_labels(model_dir: str, filename: str, output: str = "") -> tuple[bytes, ...]:
    """One label per line, kept as bytes (no decoding, a '\\r' stays as Triton keeps it). The file must lie
    in the model directory: a config loaded over the API cannot make labels of the server's other files."""
    base = os.path.normpath(model_dir)
    path = os.path.normpath(os.path.join(base, filename.lstrip("/")))  # as Triton's JoinPath: under the dir
    if not path.startswith(base + os.sep):
        raise invalid_arg(f"label_filename '{filename}' of output '{output}' must name a file in the model "
                          "directory")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_LABEL_FILE_BYTES + 1)
    except OSError as exc:
        raise internal(f"failed to open text file for read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_LABEL_FILE_BYTES:
        raise invalid_arg(f"label file {path} is larger than {MAX_LABEL_FILE_BYTES} bytes")
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the last line's newline starts no label
    return tuple(lines)


# ---------------------------------------------------------------- per request

def class_count(value: Any, output: str) -> int:
    """k of one requested output's `classification` parameter (0: not classified)."""
    if type(value) is not int or value < 0:
        raise invalid_arg(f"'classification' of output '{output}' must be a non-negative integer")
    return value & 0xFFFFFFFF  # Triton keeps it in a uint32_t


def requested(outputs: list[RequestedOutput]) -> dict[str, int] | None:
    """{output name: k} for the outputs a request wants classified; None when it wants none."""
    wanted: dict[str, int] | None = None
    for out in outputs:
        params = out.parameters
        if params and PARAM in params:
            k = class_count(params[PARAM], out.name)
            if k:
                if wanted is None:
                    wanted = {}
                wanted[out.name] = k
    return wanted


def apply(response: InferResponse, wanted: dict[str, int], labels: Labels, batched: bool) -> InferResponse:
    """The response with each output named in `wanted` replaced by its classification (in place)."""
    response.outputs = [classify(t, wanted[t.name], labels.get(t.name, ()), batched) if t.name in wanted else t
                        for t in response.outputs]
    return response


def classify(tensor: Tensor, k: int, labels: tuple[bytes, ...] = (), batched: bool = False) -> Tensor:
    """The BYTES tensor of the top k entries of `tensor` (per batch item when `batched`)."""
    dt = BY_NAME.get(tensor.datatype)
    if dt is None or dt.name not in SUPPORTED or dt.numpy is None:
        raise invalid_arg(f"class result not available for output due to unsupported type '{tensor.datatype}'")
    values = np.frombuffer(tensor.data, dtype=dt.numpy)
    shape = list(tensor.shape)
    if values.size != element_count(shape):
        raise internal(f"output '{tensor.name}' holds {values.size} elements, its shape {shape} needs "
                       f"{element_count(shape)}")
    rows = shape[0] if batched and shape else 1
    per_row = element_count(shape[1:]) if batched and shape else values.size
    n = min(k, per_row)
    out_shape = [rows, n] if batched and shape else [n]
    if rows == 0 or n == 0:
        return Tensor(tensor.name, "BYTES", out_shape, b"")
    matrix = values.reshape(rows, per_row)
    keys = np.where(np.isnan(matrix), -np.inf, matrix) if dt.numpy.kind == "f" else matrix
    # descending, equal values by ascending index: a stable ascending sort of the reversed rows, reversed
    order = (per_row - 1) - np.argsort(keys[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :n]
    top = np.take_along_axis(matrix, order, axis=1)
    fmt = b"%f:%d" if dt.numpy.kind == "f" else b"%d:%d"
    n_labels = len(labels)
    items = []
    for idx_row, val_row in zip(order.tolist(), top.tolist()):
        for idx, value in zip(idx_row, val_row):
            item = fmt % (value, idx)
            label = labels[idx] if idx < n_labels else b""
            items.append(item + b":" + label if label else item)
    return Tensor(tensor.name, "BYTES", out_shape, pack_bytes(items))
