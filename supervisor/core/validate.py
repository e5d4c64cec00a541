"""Request checks against a model's config, done before anything reaches a worker.

Messages follow Triton's wording (reference/triton.md §1.3) so clients and tests that match on
them keep working.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import Any

from inferd.worker.wire import dtypes
from inferd.worker.wire.errors import InferdError, invalid_arg

from ..inference.tensors import check_bytes_framing
from ..inference.types import InferRequest
from ..memory.cuda_regions import CudaSpan

_NAME = attrgetter("name")
_PASSED_MAX = 256  # remembered (input, datatype, shape) per model version; cleared when full


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # protocol name
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class IOSpec:
    model_name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    # control inputs the scheduler injects (sequence batching), never sent by clients
    injected: frozenset[str] = frozenset()

    @cached_property
    def passed(self) -> dict[tuple[str, str, tuple[int, ...]], tuple[int | None, int, int, int]]:
        """(input name, datatype, shape) -> (its batch dimension or None, element count, byte size or -1 for
        BYTES, 1 if a required input else 0) for the inputs of this spec that passed every check but the
        bytes': a tensor seen before is not walked again."""
        return {}

    @cached_property
    def required(self) -> list[str]:
        """Inputs a client must send (not optional, not injected by the scheduler), in config order."""
        return [n for n, ts in self.inputs.items() if not ts.optional and n not in self.injected]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> IOSpec:
        def spec(entry: dict[str, Any], allow_optional: bool) -> TensorSpec:
            dt = dtypes.BY_CONFIG_NAME.get(entry.get("data_type", ""))
            return TensorSpec(entry["name"], dt.name if dt else "INVALID",
                              tuple(int(d) for d in entry.get("dims", [])),
                              bool(entry.get("optional", False)) if allow_optional else False)

        sequence = config.get("sequence_batching") or {}
        injected = {c.get("name", "") for c in sequence.get("control_input") or []}
        injected |= {s.get("input_name", "") for s in sequence.get("state") or []}
        return cls(
            model_name=config.get("name", ""),
            max_batch_size=int(config.get("max_batch_size", 0)),
            inputs={i["name"]: spec(i, True) for i in config.get("input", [])},
            outputs={o["name"]: spec(o, False) for o in config.get("output", [])},
            injected=frozenset(injected - {""}),
        )


def _shape_matches(dims: tuple[int, ...], shape: list[int]) -> bool:
    if len(dims) != len(shape):
        return False
    for d, s in zip(dims, shape):  # noqa: SIM110 (a plain loop: no generator per request)
        if d != s and d != -1:
            return False
    return True


def validate_request(spec: IOSpec, request: InferRequest) -> None:
    # the usual request: every input passed before (name, datatype, shape), its bytes exactly the size
    # seen then, each required input given once, batch sizes that agree, known outputs; anything else
    # (a first sight, any error) runs every check in order below, which gives the messages
    passed = spec.passed
    inputs = request.inputs
    batch_size = -1
    required = 0
    for tensor in inputs:
        shape = tensor.shape
        known = passed.get((tensor.name, tensor.datatype, tuple(shape)))
        if known is None:
            break
        data = tensor.data
        if type(data) is bytes:
            if len(data) != known[2]:
                break
        elif type(data) is not memoryview or not data.c_contiguous or data.nbytes != known[2]:
            break  # (a binary request's tensor is a view of its body: bytes counted as _check_size counts)
        if tensor.device_ref is not None:
            break
        batch = known[0]
        if batch is not None:
            if batch_size < 0:
                batch_size = batch
            elif batch != batch_size:
                break
        required += known[3]
    else:
        if (required == len(spec.required) and batch_size <= spec.max_batch_size
                and (len(inputs) < 2 or len({t.name for t in inputs}) == len(inputs))):
            outputs = request.outputs
            if not outputs:
                return
            spec_outputs = spec.outputs
            for out in outputs:
                if out.name not in spec_outputs:
                    break
            else:
                if len(outputs) < 2 or len({o.name for o in outputs}) == len(outputs):
                    return
    try:
        _validate(spec, request)
    except InferdError as exc:
        # Triton prefixes request errors with the request id
        exc.message = "[request id: %s] %s" % (request.id or "<id_unknown>", exc.message)
        exc.args = (exc.message,)
        raise


def _validate(spec: IOSpec, request: InferRequest) -> None:
    model = spec.model_name
    inputs = request.inputs
    spec_inputs = spec.inputs
    required = spec.required
    given = list(map(_NAME, inputs))
    for n in required:
        if n not in given:
            break
    else:
        n = ""
    if n or len(given) > len(spec_inputs):
        missing = [n for n in required if n not in given]
        total = len(spec_inputs) - len(spec.injected.intersection(spec_inputs))
        # Triton's wording: a range where some inputs are optional (qa L0_optional_input, L0_http)
        wording = ("%d inputs" % total if total == len(required)
                   else "number of inputs between %d and %d" % (len(required), total))
        raise invalid_arg("expected %s but got %d inputs for model '%s'. Got input(s) %s, but missing "
                          "required input(s) %s. Please provide all required input(s)."
                          % (wording, len(given), model, _names(given), _names(missing)))
    seen: set[str] = set()
    batch_size: int | None = None
    max_batch = spec.max_batch_size
    passed = spec.passed
    for tensor in inputs:
        name = tensor.name
        if name in seen:
            raise invalid_arg("input '%s' is specified more than once for model '%s'" % (name, model))
        seen.add(name)
        datatype = tensor.datatype
        shape = tensor.shape
        key = (name, datatype, tuple(shape))
        known = passed.get(key)
        if known is not None:  # the checks below passed for this name, datatype and shape before
            batch, count, nbytes, _required = known
            if batch is not None:
                if batch_size is None:
                    batch_size = batch
                elif batch != batch_size:
                    raise invalid_arg("input '%s' batch size %d does not match %d of the other inputs for model "
                                      "'%s'" % (name, batch, batch_size, model))
            data = tensor.data
            if type(data) is not bytes or len(data) != nbytes or tensor.device_ref is not None:
                _check_size(tensor, datatype, count, name, model)  # (bytes of the right size pass)
            continue
        ts = spec_inputs.get(name)
        if ts is None or name in spec.injected:
            raise invalid_arg("unexpected inference input '%s' for model '%s'" % (name, model))
        if datatype != ts.datatype:
            raise invalid_arg("inference input '%s' data-type is '%s', but model '%s' expects '%s'"
                              % (name, datatype, model, ts.datatype))
        count = 1
        for s in shape:
            if s < 0:
                raise invalid_arg("input '%s' has a negative dimension %s" % (name, list(shape)))
            count *= s
        if max_batch > 0:
            if not shape:
                raise invalid_arg("input '%s' for model '%s' needs a batch dimension" % (name, model))
            item_shape = shape[1:]
            if batch_size is None:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise invalid_arg("input '%s' batch size %d does not match %d of the other inputs for model '%s'"
                                  % (name, shape[0], batch_size, model))
        else:
            item_shape = shape
        if not _shape_matches(ts.dims, item_shape):
            expected = ([-1] if max_batch > 0 else []) + list(ts.dims)
            raise invalid_arg("unexpected shape for input '%s' for model '%s'. Expected %s, got %s"
                              % (name, model, _fmt(expected), _fmt(list(shape))))
        _check_size(tensor, datatype, count, name, model)
        if len(passed) >= _PASSED_MAX:
            passed.clear()
        passed[key] = (shape[0] if max_batch > 0 else None, count,
                       -1 if datatype == "BYTES" else count * dtypes.BY_NAME[datatype].itemsize,
                       int(not ts.optional))
    if batch_size is not None and batch_size > max_batch:
        raise invalid_arg("inference request batch-size must be <= %d for '%s'" % (max_batch, model))
    outputs = request.outputs
    if outputs:
        spec_outputs = spec.outputs
        for out in outputs:
            if out.name not in spec_outputs:
                raise invalid_arg("unexpected inference output '%s' for model '%s'" % (out.name, model))
        if len({o.name for o in outputs}) != len(outputs):
            raise invalid_arg("output requested more than once for model '%s'" % model)


def _check_size(tensor: Any, datatype: str, count: int, name: str, model: str) -> None:
    """The tensor's bytes hold `count` elements of `datatype` (BYTES: their length prefixes do)."""
    if datatype == "BYTES":
        check_bytes_framing(tensor.data, count, name)
        return
    expected_bytes = count * dtypes.BY_NAME[datatype].itemsize
    data = tensor.data
    device = tensor.device_ref  # device memory: its size is what the producer declared
    got = (device.nbytes if device is not None else len(data) if type(data) is bytes
           else data.nbytes if type(data) is CudaSpan else len(memoryview(data).cast("B")))
    if got != expected_bytes:
        raise invalid_arg("input byte size mismatch for input '%s' for model '%s'. Expected %d, got %d"
                          % (name, model, expected_bytes, got))


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(str(s) for s in shape) + "]"


def _names(names: list[str]) -> str:
    return "[" + ",".join("'%s'" % n for n in names) + "]"
