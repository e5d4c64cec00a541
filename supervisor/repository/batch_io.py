"""Load-time checks of `batch_input` and `batch_output` (ragged batching), with Triton 2.51's messages
(core's ValidateBatchIO, observed on the real server).

- batch_input: exactly one `source_input`, `data_type` TYPE_INT32 or TYPE_FP32, a source that names a
  configured input.
- batch_output: exactly one `source_input` naming a configured input; each `target_name` a configured
  output, named once. A batch_output with no `target_name` is refused here (Triton 2.51 crashes with a
  segmentation fault on it).

Names are checked against the inputs / outputs only once the config has some: a config whose backend
fills them (auto-complete) is checked again after that (normalize runs before and after it).
"""

from __future__ import annotations

from typing import Any

from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.worker.wire.errors import invalid_arg

_BATCH_INPUT_TYPES = (mc.TYPE_INT32, mc.TYPE_FP32)


def validate_batch_io(config: mc.ModelConfig) -> None:
    """INVALID_ARG naming the first problem of the config's batch_input / batch_output entries."""
    m = config.name
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for bi in config.batch_input:
        kind = _kind_name(mc.BatchInput.Kind, bi.kind, "batch input", m)
        if len(bi.source_input) != 1:
            raise invalid_arg(f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)} for {m}")
        if bi.data_type not in _BATCH_INPUT_TYPES:
            raise invalid_arg(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {m}")
        _check_source(bi.source_input[0], inputs, m)
    for bo in config.batch_output:
        kind = _kind_name(mc.BatchOutput.Kind, bo.kind, "batch output", m)
        if len(bo.source_input) != 1:
            raise invalid_arg(f"batch output kind '{kind}' expects 1 source input, got {len(bo.source_input)} for {m}")
        _check_source(bo.source_input[0], inputs, m)
        if not bo.target_name:
            raise invalid_arg(f"batch output kind '{kind}' expects at least 1 target output name, got 0 for {m}")
        seen: set[str] = set()
        for target in bo.target_name:
            if outputs and target not in outputs:
                raise invalid_arg(f"unknown target output name '{target}' for {m}")
            if target in seen:
                raise invalid_arg(f"target output name '{target}' can only be specified once for {m}")
            seen.add(target)


def _kind_name(enum: Any, value: int, what: str, model: str) -> str:
    """The kind's name; a number the enum does not define (config.pbtxt may give `kind: 99`) is refused."""
    try:
        return str(enum.Name(value))
    except ValueError:
        raise invalid_arg(f"unknown {what} kind {value} for {model}") from None


def _check_source(name: str, inputs: set[str], model: str) -> None:
    if inputs and name not in inputs:
        raise invalid_arg(f"unknown source input name '{name}' for {model}")
