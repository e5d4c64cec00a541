"""Sequence-batcher control inputs (START, END, READY, CORRID) as the model config declares them, and
the wire-form tensors the scheduler injects into each request (reference/triton.md §3.7, §6.4).

A control is never sent by clients (it is not listed under `input`). Each injected tensor has shape
[1] (max_batch_size 0) or [1, 1] (batching model; [B, 1] once batched). START / END / READY carry
the configured false/true pair (int32_false_true, fp32_false_true or bool_false_true); CORRID carries
the request's correlation id in its configured data_type.

Correlation ids and CORRID types that do not match: a string id given to a numeric CORRID becomes
a stable 64-bit hash of the string (Triton hands the model an opaque number too); an integer id given
to a TYPE_STRING CORRID becomes its decimal text.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire.errors import invalid_arg

from ...inference.types import Tensor

START, END, READY, CORRID = "START", "END", "READY", "CORRID"
_KINDS = {
    "CONTROL_SEQUENCE_START": START,
    "CONTROL_SEQUENCE_END": END,
    "CONTROL_SEQUENCE_READY": READY,
    "CONTROL_SEQUENCE_CORRID": CORRID,
}
# config data_type -> (wire datatype, struct format) for CORRID
_CORRID_TYPES = {
    "TYPE_UINT64": ("UINT64", "<Q"),
    "TYPE_INT64": ("INT64", "<q"),
    "TYPE_UINT32": ("UINT32", "<I"),
    "TYPE_INT32": ("INT32", "<i"),
    "TYPE_STRING": ("BYTES", ""),
}


@dataclass(frozen=True)
class Control:
    """One injected input: its name, what it signals, wire datatype and (flags only) false/true bytes."""

    name: str
    kind: str  # START | END | READY | CORRID
    datatype: str
    false_bytes: bytes = b""
    true_bytes: bytes = b""
    corrid_format: str = ""  # struct format for a numeric CORRID; "" for a string one


def parse_controls(model: str, sequence_batching: dict[str, Any]) -> list[Control]:
    """The control inputs of a normalised `sequence_batching` config (Triton JSON rendering)."""
    controls: list[Control] = []
    for entry in sequence_batching.get("control_input") or []:
        name = str(entry.get("name", ""))
        for control in entry.get("control") or []:
            kind = _KINDS.get(str(control.get("kind", "CONTROL_SEQUENCE_START")))
            if kind is None:
                raise invalid_arg("sequence batching control input '%s' of model '%s' has an unknown kind %r"
                                  % (name, model, control.get("kind")))
            if kind == CORRID:
                typed = _CORRID_TYPES.get(str(control.get("data_type", "")))
                if typed is None:
                    raise invalid_arg("sequence batching control input '%s' of model '%s' has an unsupported "
                                      "CORRID data_type %r" % (name, model, control.get("data_type")))
                controls.append(Control(name, kind, typed[0], corrid_format=typed[1]))
                continue
            controls.append(_flag_control(model, name, kind, control))
    return controls


def _flag_control(model: str, name: str, kind: str, control: dict[str, Any]) -> Control:
    if control.get("int32_false_true"):
        false, true = (int(v) for v in control["int32_false_true"])
        return Control(name, kind, "INT32", struct.pack("<i", false), struct.pack("<i", true))
    if control.get("fp32_false_true"):
        false_f, true_f = (float(v) for v in control["fp32_false_true"])
        return Control(name, kind, "FP32", struct.pack("<f", false_f), struct.pack("<f", true_f))
    if control.get("bool_false_true"):
        false_b, true_b = (bool(v) for v in control["bool_false_true"])
        return Control(name, kind, "BOOL", bytes([false_b]), bytes([true_b]))
    raise invalid_arg("sequence batching control input '%s' of model '%s' must give a false/true pair"
                      % (name, model))


def corrid_bytes(control: Control, correlation_id: int | str) -> bytes:
    """The wire bytes of one CORRID element (BYTES: 4-byte length prefix, then the text)."""
    if not control.corrid_format:
        text = correlation_id.encode("utf-8") if isinstance(correlation_id, str) else str(correlation_id).encode()
        return struct.pack("<I", len(text)) + text
    if isinstance(correlation_id, str):
        digest = hashlib.blake2b(correlation_id.encode("utf-8"), digest_size=8).digest()
        value = int.from_bytes(digest, "little") >> 1  # non-negative in INT64 too; 32-bit types keep the low bits
    else:
        value = correlation_id
    fmt = control.corrid_format
    if fmt in ("<I", "<i"):
        value &= 0xFFFFFFFF
        if fmt == "<i" and value >= 1 << 31:
            value -= 1 << 32
    else:
        value &= 0xFFFFFFFFFFFFFFFF
        if fmt == "<q" and value >= 1 << 63:
            value -= 1 << 64
    return struct.pack(fmt, value)


def control_tensors(controls: list[Control], *, start: bool, end: bool, ready: bool,
                    correlation_id: int | str, batched: bool) -> list[Tensor]:
    """The control tensors of one request (a null request: ready=False, correlation_id 0)."""
    shape = [1, 1] if batched else [1]
    out: list[Tensor] = []
    for control in controls:
        kind = control.kind
        if kind == CORRID:
            data = corrid_bytes(control, correlation_id)
        else:
            on = start if kind == START else end if kind == END else ready
            data = control.true_bytes if on else control.false_bytes
        out.append(Tensor(control.name, control.datatype, list(shape), data))
    return out
