"""An ensemble's step graph: parsed from its config, checked, and turned into a dataflow plan.

Checks come in two stages, as in Triton: `build_plan` needs only the ensemble's own config (tensors
written twice, unused inputs or outputs, tensors no step can ever receive — which also catches cycles);
`check_composing` needs the composing models' configs (unknown models, unknown input/output names,
datatype and shape agreement of every ensemble tensor, batch sizes). Messages follow Triton's wording
(checked against Triton 2.51) so that operators recognise them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError


def _invalid(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


@dataclass(frozen=True)
class Step:
    index: int
    model_name: str
    model_version: int  # -1: the composing model's latest ready version
    input_map: dict[str, str]  # composing model input -> ensemble tensor
    output_map: dict[str, str]  # composing model output -> ensemble tensor

    @property
    def version_str(self) -> str:
        return "" if self.model_version < 0 else str(self.model_version)


@dataclass(frozen=True)
class EnsemblePlan:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    # ensemble tensor -> indices of the steps that read it
    consumers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # steps whose model is decoupled (set at load, once the composing models are known): each of
    # their responses feeds the later steps separately, so the ensemble itself streams
    decoupled_steps: frozenset[int] = frozenset()
    # ensemble_scheduling.max_inflight_requests: how many requests the responses of one decoupled step
    # may have running in the later steps at once (0: no limit); the stream waits for a free slot
    max_inflight: int = 0

    @property
    def decoupled(self) -> bool:
        return bool(self.decoupled_steps)

    @property
    def composing_models(self) -> list[str]:
        return sorted({s.model_name for s in self.steps})


def _version(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def parse_steps(config: dict[str, Any]) -> list[Step]:
    raw = (config.get("ensemble_scheduling") or {}).get("step") or []
    return [Step(i, str(s.get("model_name", "")), _version(s.get("model_version", -1)),
                 {str(k): str(v) for k, v in (s.get("input_map") or {}).items()},
                 {str(k): str(v) for k, v in (s.get("output_map") or {}).items()})
            for i, s in enumerate(raw)]


def build_plan(config: dict[str, Any]) -> EnsemblePlan:
    """The dataflow plan of an ensemble config (Triton JSON rendering); INVALID_ARG when it cannot run."""
    name = str(config.get("name", ""))
    inputs = tuple(str(t["name"]) for t in config.get("input") or [])
    outputs = tuple(str(t["name"]) for t in config.get("output") or [])
    steps = parse_steps(config)
    if not steps:
        raise _invalid(f"must specify one or more 'step's for ensemble '{name}'")

    producer: dict[str, int] = {}
    for step in steps:
        for tensor in step.output_map.values():
            if tensor in producer or tensor in inputs:
                raise _invalid(f"ensemble tensor '{tensor}' can appear in an output map only once for "
                               f"ensemble '{name}' step {step.index}")
            producer[tensor] = step.index
    read = {t for s in steps for t in s.input_map.values()}
    for tensor in inputs:
        if tensor not in read:
            raise _invalid(f"ensemble input '{tensor}' for ensemble '{name}' is not used")
    for tensor in outputs:
        if tensor not in producer:
            raise _invalid(f"ensemble output '{tensor}' for ensemble '{name}' is not used")
    for step in steps:
        for tensor in step.input_map.values():
            if tensor not in producer and tensor not in inputs:
                raise _invalid(f"ensemble tensor '{tensor}' read by step {step.index} ({step.model_name}) of "
                               f"ensemble '{name}' is neither an ensemble input nor written by any step")

    # Which tensors can ever exist, starting from the inputs: anything else sits on a cycle or behind one.
    available = set(inputs)
    pending = list(steps)
    progress = True
    while pending and progress:
        progress = False
        for step in list(pending):
            if all(t in available for t in step.input_map.values()):
                available.update(step.output_map.values())
                pending.remove(step)
                progress = True
    for tensor in outputs:
        if tensor not in available:
            missing = _first_unconnected(tensor, steps, producer, available)
            raise _invalid(f"output '{tensor}' for ensemble '{name}' is not written: at least one of its "
                           f"depending tensors, '{missing}', is not connected")
    if pending:
        step = pending[0]
        missing = next(t for t in step.input_map.values() if t not in available)
        raise _invalid(f"step {step.index} ({step.model_name}) of ensemble '{name}' can never run: its input "
                       f"tensor '{missing}' is not connected to the ensemble inputs")

    consumers: dict[str, list[int]] = {}
    for step in steps:
        for tensor in set(step.input_map.values()):
            consumers.setdefault(tensor, []).append(step.index)
    max_inflight = (config.get("ensemble_scheduling") or {}).get("max_inflight_requests") or 0
    return EnsemblePlan(name, inputs, outputs, tuple(steps), {k: tuple(v) for k, v in consumers.items()},
                        max_inflight=max(0, int(max_inflight)))


def _first_unconnected(tensor: str, steps: list[Step], producer: dict[str, int], available: set[str]) -> str:
    """Walk back from an unreachable tensor to a step input that is unreachable (for the message)."""
    seen: set[str] = set()
    while tensor not in seen:
        seen.add(tensor)
        step = steps[producer[tensor]]
        missing = [t for t in step.input_map.values() if t not in available]
        if not missing:
            return tensor
        tensor = missing[0]
        if tensor not in producer:
            return tensor
    return tensor


# ---- agreement with the composing models -------------------------------------------------------------

def _full_shape(entry: dict[str, Any], batching: bool) -> list[int]:
    """The tensor's shape as requests carry it: the batch dimension (if any), then `dims`."""
    return ([-1] if batching else []) + [int(d) for d in entry.get("dims") or []]


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def check_composing(plan: EnsemblePlan, config: dict[str, Any],
                    config_of: Callable[[str, int], dict[str, Any] | None]) -> None:
    """INVALID_ARG when the steps do not fit the composing models (config_of(name, version) -> config)."""
    name = plan.name
    configs: dict[int, dict[str, Any]] = {}
    unknown = []
    for step in plan.steps:
        cfg = config_of(step.model_name, step.model_version)
        if cfg is None:
            unknown.append(step.model_name)
        else:
            configs[step.index] = cfg
    if unknown:
        raise _invalid(f"ensemble {name} contains models that are not available or ambiguous: "
                       + ", ".join(sorted(set(unknown))))

    max_batch = int(config.get("max_batch_size") or 0)
    # ensemble tensor -> (datatype, full shape, the model it was inferred from)
    known: dict[str, tuple[str, list[int], str]] = {}

    def agree(tensor: str, datatype: str, shape: list[int], source: str) -> None:
        have = known.get(tensor)
        if have is None:
            known[tensor] = (datatype, shape, source)
            return
        if have[0] != datatype:
            raise _invalid(f"in ensemble {name}, ensemble tensor {tensor}: inconsistent data type: {have[0]} is "
                           f"inferred from model {have[2]} while {datatype} is inferred from model {source}")
        if not _compatible(have[1], shape):
            raise _invalid(f"in ensemble {name}, ensemble tensor {tensor}: inconsistent shape: {_fmt(have[1])} is "
                           f"inferred from model {have[2]} while {_fmt(shape)} is inferred from model {source}")

    for entry in list(config.get("input") or []) + list(config.get("output") or []):
        agree(str(entry["name"]), str(entry.get("data_type", "")), _full_shape(entry, max_batch > 0), name)

    for step in plan.steps:
        cfg = configs[step.index]
        model = step.model_name
        step_batch = int(cfg.get("max_batch_size") or 0)
        if max_batch > 0 and step_batch < max_batch:
            if step_batch == 0:
                raise _invalid(f"ensemble {name} allows maximum batch size {max_batch}, but it contains model "
                               f"{model} which does not support batching")
            raise _invalid(f"ensemble {name} allows maximum batch size {max_batch}, but it contains model "
                           f"{model} which only allows maximum batch size to be {step_batch}")
        batching = step_batch > 0  # requests to a batching model carry a batch dimension
        model_inputs = {str(e["name"]): e for e in cfg.get("input") or []}
        model_outputs = {str(e["name"]): e for e in cfg.get("output") or []}
        for key, tensor in step.input_map.items():
            entry = model_inputs.get(key)
            if entry is None:
                raise _invalid(f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                               f"{key} in model {model}")
            agree(tensor, str(entry.get("data_type", "")), _full_shape(entry, batching), model)
        for key, tensor in step.output_map.items():
            entry = model_outputs.get(key)
            if entry is None:
                raise _invalid(f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                               f"{key} in model {model}")
            agree(tensor, str(entry.get("data_type", "")), _full_shape(entry, batching), model)
        required = [n for n, e in model_inputs.items() if not e.get("optional")]
        for key in required:
            if key not in step.input_map:
                raise _invalid(f"in ensemble {name}, input {key} of model {model} (step {step.index}) is not "
                               f"mapped to any ensemble tensor")
