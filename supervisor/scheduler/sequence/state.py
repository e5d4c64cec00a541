"""Implicit sequence state (`sequence_batching { state [...] }`): the scheduler feeds the state a
sequence's previous request produced (output `output_name`) to its next request (input `input_name`).

The first request of a sequence (START) gets the initial state: the `initial_state` entry's zeros
(`zero_data: true`) or its `data_file` (read from <model dir>/initial_state/), or, with no
initial_state, zeros of `dims` (a variable dim counts as 0 there: an empty, growable state). The state
output is captured from each successful response and never reaches the client.

Triton supports implicit state for framework backends only; inferd also supports it for Python models
(the state is just one more input and output for them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire import dtypes
from inferd.worker.wire.errors import invalid_arg

from ...inference.types import InferResponse, Tensor

MAX_INITIAL_STATE_BYTES = 1 << 30  # an initial_state data_file is read into memory: bound it


@dataclass(frozen=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: str  # wire name
    initial_shape: tuple[int, ...]  # without the batch dim
    initial_data: bytes


def _dims(values: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in values or [])


def parse_states(model: str, sequence_batching: dict[str, Any], model_dir: str | None = None) -> list[StateSpec]:
    """The implicit states of a normalised `sequence_batching` config (Triton JSON rendering)."""
    specs: list[StateSpec] = []
    for entry in sequence_batching.get("state") or []:
        input_name, output_name = str(entry.get("input_name", "")), str(entry.get("output_name", ""))
        if not input_name or not output_name:
            raise invalid_arg("sequence batching state of model '%s' must specify 'input_name' and 'output_name'"
                              % model)
        dt = dtypes.BY_CONFIG_NAME.get(str(entry.get("data_type", "")))
        if dt is None or dt.name == "BYTES":
            raise invalid_arg("sequence batching state '%s' of model '%s' has an unsupported data_type %r"
                              % (input_name, model, entry.get("data_type")))
        initial = (entry.get("initial_state") or [None])[0]
        if initial is None:
            shape = tuple(max(d, 0) for d in _dims(entry.get("dims")))
            data = bytes(_count(shape) * dt.itemsize)
        else:
            shape = _dims(initial.get("dims"))
            if any(d < 0 for d in shape):
                raise invalid_arg("initial_state of state '%s' of model '%s' must have fixed dims"
                                  % (input_name, model))
            size = _count(shape) * dt.itemsize
            if initial.get("data_file"):
                data = _read_initial(model, model_dir, str(initial["data_file"]), size)
            else:
                data = bytes(size)
        specs.append(StateSpec(input_name, output_name, dt.name, shape, data))
    return specs


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _read_initial(model: str, model_dir: str | None, name: str, size: int) -> bytes:
    if model_dir is None:
        raise invalid_arg("initial_state data_file '%s' of model '%s' cannot be read here" % (name, model))
    base = os.path.realpath(os.path.join(model_dir, "initial_state"))
    path = os.path.realpath(os.path.join(base, name))
    if not path.startswith(base + os.sep):
        raise invalid_arg("initial_state data_file '%s' of model '%s' lies outside its model directory"
                          % (name, model))
    if size > MAX_INITIAL_STATE_BYTES:
        raise invalid_arg("initial_state of model '%s' is too large (%d bytes)" % (model, size))
    try:
        with open(path, "rb") as f:
            data = f.read(size + 1)
    except OSError as exc:
        raise invalid_arg("cannot read initial_state data_file '%s' of model '%s': %s"
                          % (name, model, exc.strerror)) from None
    if len(data) != size:
        raise invalid_arg("initial_state data_file '%s' of model '%s' holds %d bytes, its dims need %d"
                          % (name, model, len(data), size))
    return data


def initial_tensors(states: list[StateSpec], batched: bool) -> dict[str, Tensor]:
    """input name -> the START state tensor (with a batch dim of 1 for a batching model)."""
    prefix = [1] if batched else []
    return {s.input_name: Tensor(s.input_name, s.datatype, prefix + list(s.initial_shape), s.initial_data)
            for s in states}


def capture(states: list[StateSpec], response: InferResponse, current: dict[str, Tensor]) -> dict[str, Tensor]:
    """The next state of a sequence from one successful response (a state the model did not return
    keeps its value); the state outputs are taken out of the response."""
    if not states:
        return current
    by_output = {s.output_name: s for s in states}
    kept: list[Tensor] = []
    nxt = dict(current)
    for tensor in response.outputs:
        spec = by_output.get(tensor.name)
        if spec is None:
            kept.append(tensor)
            continue
        # the response's buffer is a view of a worker frame: keep our own copy for the next request
        nxt[spec.input_name] = Tensor(spec.input_name, tensor.datatype, list(tensor.shape), bytes(tensor.data))
    response.outputs = kept
    return nxt
