"""What a model is sent for a completion, with Triton's conventions so that Triton's LLM repositories
work unchanged (its OpenAI frontend's engine/utils/triton.py is the reference):

- a model of backend "vllm" (or every model with --openai-backend vllm) gets `text_input`, `stream`,
  `sampling_parameters` (a JSON string: the request's sampling fields, `max_tokens`, `logprobs`, LoRA and
  structured-output settings), `exclude_input_in_output`, and the `return_num_input_tokens`,
  `return_num_output_tokens` and `return_logprobs` flags;
- every other model (decoupled Python models, ensembles, TensorRT-LLM) gets TensorRT-LLM style tensors:
  `text_input`, `stream`, `max_tokens`, `stop_words`, `temperature`, `top_p`, `top_k`,
  `seed`, `frequency_penalty`, `presence_penalty`, `repetition_penalty`, `min_tokens` (or `min_length`),
  the echo flag, guided decoding, the `return_num_*_tokens` flags.

Each tensor goes only to a model that declares that input (shaped and typed as its config says), so a
model sees nothing it did not ask for; a model without `text_input` cannot serve completions (400).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import orjson
from inferd.supervisor.core.model_handle import ModelHandle
from inferd.supervisor.inference.tensors import ARRAY_CODES, json_to_raw, pack_plain
from inferd.supervisor.inference.types import InferRequest, Tensor

from .errors import OpenAIError, bad_request

_LEN = struct.Struct("<I")  # a BYTES element's length prefix
VLLM = "vllm"
TRTLLM = "tensorrtllm"
ECHO_INPUTS = ("exclude_input_in_output", "sampling_param_exclude_input_from_output")

# OpenAI request fields that are not vLLM sampling parameters (Triton's list, plus those handled here)
_NOT_SAMPLING = frozenset({
    "model", "stream", "messages", "prompt", "echo", "store", "metadata", "response_format", "service_tier",
    "stream_options", "tools", "tool_choice", "parallel_tool_calls", "user", "function_call", "functions",
    "suffix", "max_completion_tokens", "max_tokens", "logprobs", "top_logprobs", "best_of",
})
# OpenAI field -> TensorRT-LLM style input
_TRTLLM_SCALARS = (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("seed", "seed"),
                   ("frequency_penalty", "frequency_penalty"), ("presence_penalty", "presence_penalty"),
                   ("repetition_penalty", "repetition_penalty"))


@dataclass
class Generation:
    """What one completion asks of the model, whichever endpoint it came from."""

    prompt: str
    body: dict[str, Any]  # the request as parsed (schema.py)
    stream: bool
    max_tokens: int
    echo: bool = False
    logprobs: int = 0  # top tokens per position wanted (0: none)
    guide: tuple[str, Any] | None = None  # ("json", schema) | ("json_object", None): structured output
    guide_optional: bool = False  # from a tool choice: sent where the model can take it, else left out
    lora: str | None = None
    lora_task: int = 0  # TensorRT-LLM style: the LoRA's task id (1-based, its place in multi_lora.json)


@dataclass
class ModelInputs:
    """A model's declared inputs, read once per loaded version."""

    specs: dict[str, dict[str, Any]]
    batched: bool
    convention: str
    echo_input: str | None = None
    text_outputs: tuple[str, ...] = field(default=())
    # name -> (datatype, shape) of that input holding one value, when it packs by `_pack_one` (None: it does
    # not); filled as inputs are first built: a request's few scalar tensors then cost a dict look-up each
    _one: dict[str, tuple[str, list[int]] | None] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, config: dict[str, Any], forced: str = "") -> ModelInputs:
        specs = {str(i.get("name")): i for i in config.get("input") or [] if isinstance(i, dict)}
        convention = forced or (VLLM if config.get("backend") == VLLM else TRTLLM)
        echo = next((n for n in ECHO_INPUTS if n in specs), None)
        return cls(specs, int(config.get("max_batch_size") or 0) > 0, convention, echo)

    def has(self, name: str) -> bool:
        return name in self.specs

    def tensor(self, name: str, values: list[Any]) -> Tensor:
        """Input `name` holding `values`, shaped by the config's dims (a batch of 1 for a batching model,
        the variable dims sized to fit) and packed in its declared datatype."""
        if len(values) == 1:  # the usual case (a prompt, a flag, a number): the same tensor, packed directly
            one = self._one.get(name, _UNSET)
            if one is _UNSET:
                one = self._one[name] = self._single(name)
            if one is not None:
                raw = _pack_one(one[0], values[0])
                if raw is not None:
                    return Tensor(name, one[0], list(one[1]), raw)
        datatype = self._datatype(name)
        shape = _shape(name, [int(d) for d in self.specs[name].get("dims") or []], self.batched, len(values))
        return Tensor(name, datatype, shape, json_to_raw(datatype, shape, values, name))

    def _datatype(self, name: str) -> str:
        datatype = str(self.specs[name].get("data_type", "")).removeprefix("TYPE_")
        return "BYTES" if datatype == "STRING" else datatype

    def _single(self, name: str) -> tuple[str, list[int]] | None:
        datatype = self._datatype(name)
        if datatype not in _ONE_PACKED:
            return None
        try:
            return datatype, _shape(name, [int(d) for d in self.specs[name].get("dims") or []], self.batched, 1)
        except (OpenAIError, TypeError, ValueError):
            return None  # the general path raises it, as before


_UNSET: Any = object()
_ONE_PACKED = frozenset(("BYTES", "BOOL", *ARRAY_CODES))


def _pack_one(datatype: str, value: Any) -> bytes | None:
    """One value in `json_to_raw`'s bytes, for the plain cases (a str, a bool, an in-range number); None for
    anything else, which json_to_raw then packs or refuses as before."""
    if datatype == "BYTES":
        if type(value) is not str:
            return None
        try:
            data = value.encode("utf-8")
        except UnicodeError:
            return None
        return _LEN.pack(len(data)) + data
    if datatype == "BOOL":
        return (b"\x01" if value else b"\x00") if type(value) is bool else None
    return pack_plain(ARRAY_CODES[datatype], [value])


def _shape(name: str, dims: list[int], batched: bool, count: int) -> list[int]:
    shape = [1 if d < 0 else d for d in dims]
    size = 1
    for d in shape:
        size *= d
    if size != count:
        fixed = size  # the variable dims count 1 in it
        variable = [i for i, d in enumerate(dims) if d < 0]
        if not variable or not fixed or count % fixed:
            raise bad_request(f"the model's input '{name}' has dims {dims}, which cannot hold {count} value(s)")
        shape[variable[-1]] = count // fixed
    return [1, *shape] if batched else shape


def generate_request(model: str, version: str, inputs: ModelInputs, gen: Generation,
                     handle: ModelHandle | None = None) -> InferRequest:
    """The model's request for `gen`; `handle`: the model as the request resolved it (DataPlane.model), which
    the data plane then takes instead of looking `model` up again."""
    if not inputs.has("text_input"):
        raise bad_request(f"model '{model}' cannot serve completions: it declares no input 'text_input' (the "
                          "prompt, as Triton's vLLM and TensorRT-LLM models have it)", code="model_inputs")
    build = _vllm if inputs.convention == VLLM else _trtllm
    tensors = build(model, inputs, gen)
    for flag in ("return_num_input_tokens", "return_num_output_tokens"):
        if inputs.has(flag):
            tensors.append(inputs.tensor(flag, [True]))
    return InferRequest(model_name=model, model_version=version, inputs=tensors, model=handle)


def _vllm(model: str, inputs: ModelInputs, gen: Generation) -> list[Tensor]:
    params = {k: v for k, v in gen.body.items() if k not in _NOT_SAMPLING and v is not None}
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    params["max_tokens"] = gen.max_tokens
    if gen.logprobs:
        params["logprobs"] = gen.logprobs
    if gen.lora is not None:
        params["lora_name"] = gen.lora
    if gen.guide is not None:  # vLLM's StructuredOutputsParams (the vllm backend reads it as JSON)
        kind, schema = gen.guide
        params["structured_outputs"] = orjson.dumps({"json": schema} if kind == "json" else
                                                    {"json_object": True}).decode()
    out = [inputs.tensor("text_input", [gen.prompt])]
    if inputs.has("stream"):
        out.append(inputs.tensor("stream", [gen.stream]))
    if inputs.has("sampling_parameters"):
        out.append(inputs.tensor("sampling_parameters", [orjson.dumps(params).decode()]))
    if inputs.echo_input is not None:
        out.append(inputs.tensor(inputs.echo_input, [not gen.echo]))
    if inputs.has("return_logprobs"):
        out.append(inputs.tensor("return_logprobs", [gen.logprobs > 0]))
    return out


def _trtllm(model: str, inputs: ModelInputs, gen: Generation) -> list[Tensor]:
    body = gen.body
    out = [inputs.tensor("text_input", [gen.prompt])]
    has = inputs.has
    if has("stream"):
        out.append(inputs.tensor("stream", [gen.stream]))
    if has("max_tokens"):
        out.append(inputs.tensor("max_tokens", [gen.max_tokens]))
    stop = body.get("stop")
    if stop and has("stop_words"):
        out.append(inputs.tensor("stop_words", [stop] if isinstance(stop, str) else list(stop)))
    for field_name, input_name in _TRTLLM_SCALARS:
        value = body.get(field_name)
        if value is not None and has(input_name):
            out.append(inputs.tensor(input_name, [value]))
    min_tokens = body.get("min_tokens")
    if min_tokens is not None:
        for name in ("min_tokens", "min_length"):
            if has(name):
                out.append(inputs.tensor(name, [min_tokens]))
                break
    if inputs.echo_input is not None and "echo" in body:
        out.append(inputs.tensor(inputs.echo_input, [not gen.echo]))
    if gen.lora is not None:
        if not has("lora_task_id"):
            raise bad_request(f"model '{model}' takes no LoRA adapter (it declares no input 'lora_task_id')")
        out.append(inputs.tensor("lora_task_id", [gen.lora_task]))
    if gen.guide is not None:
        kind, schema = gen.guide
        if not (has("guided_decoding_guide_type") and has("guided_decoding_guide")):
            if gen.guide_optional:
                return out
            raise bad_request(f"model '{model}' cannot honour response_format: it declares no guided decoding "
                              "inputs (guided_decoding_guide_type, guided_decoding_guide)", param="response_format")
        guide = orjson.dumps(schema).decode() if kind == "json" else ""
        out.append(inputs.tensor("guided_decoding_guide_type", ["json_schema" if kind == "json" else "json"]))
        out.append(inputs.tensor("guided_decoding_guide", [guide]))
    return out


def supports_guided(inputs: ModelInputs) -> bool:
    return inputs.convention == VLLM or (inputs.has("guided_decoding_guide_type")
                                         and inputs.has("guided_decoding_guide"))
