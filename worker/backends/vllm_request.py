"""The vLLM backend's request and response tensors, as Triton's vllm_backend defines them (its README and
src/utils/request.py): what a request asks (`parse`), the sampling parameters vLLM gets (`sampling_params`),
and the response tensors built from one of vLLM's RequestOutputs (`ResponseBuilder`).

Only `sampling_params` and `ResponseBuilder` touch vLLM objects, and only those passed in: this module
imports no vLLM, so a worker without vLLM can still auto-complete a config (INPUTS / OUTPUTS below).
"""

from __future__ import annotations

import functools
import json
import typing
from typing import Any, Optional

import numpy as np

from ..wire.errors import ErrorCode, InferdError
from .base import Request, Response, Tensor

# what vllm_backend's auto_complete_config declares (an input or output the config already names is kept)
INPUTS: tuple[dict[str, Any], ...] = (
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
    {"name": "image", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "exclude_input_in_output", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_finish_reason", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_cumulative_logprob", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_logprobs", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_num_input_tokens", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_num_output_tokens", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "embedding_request", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
)
OUTPUTS: tuple[dict[str, Any], ...] = (
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
)
RETURN_FLAGS = ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
                "return_num_output_tokens")


def auto_complete(config: dict[str, Any]) -> dict[str, Any]:
    """vllm_backend's auto-complete: the inputs and outputs it declares that the config lacks, decoupled,
    max_batch_size 0 (vLLM batches itself)."""
    out = dict(config)
    for key, declared in (("input", INPUTS), ("output", OUTPUTS)):
        have = list(out.get(key) or [])
        names = {entry.get("name") for entry in have}
        have.extend(dict(entry) for entry in declared if entry["name"] not in names)
        out[key] = have
    out["model_transaction_policy"] = {**(out.get("model_transaction_policy") or {}), "decoupled": True}
    out["max_batch_size"] = 0
    return out


def _invalid(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


class Asked:
    """What one request asks of the engine."""

    __slots__ = ("prompt", "stream", "prepend_input", "parameters", "flags", "lora_name")

    def __init__(self, prompt: str, stream: bool, prepend_input: bool, parameters: dict[str, Any],
                 flags: dict[str, bool]) -> None:
        self.prompt = prompt
        self.stream = stream
        self.prepend_input = prepend_input
        self.parameters = parameters  # the sampling parameters, lora_name taken out
        self.flags = flags
        self.lora_name: Optional[str] = parameters.pop("lora_name", None)


def _first(tensor: Tensor) -> Any:
    flat = np.asarray(tensor.array).reshape(-1)
    if flat.size == 0:
        raise _invalid("input '%s' is empty" % tensor.name)
    return flat[0]


def _text(value: Any, name: str) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid("input '%s' is not valid UTF-8" % name) from None
    return str(value)


def parse(request: Request) -> Asked:
    """The request's inputs read as vllm_backend reads them; INVALID_ARG naming what is wrong."""
    inputs = {t.name: t for t in request.inputs}
    if "embedding_request" in inputs:
        raise InferdError(ErrorCode.UNSUPPORTED, "inferd's vllm backend serves 'generate' requests only: "
                          "'embedding_request' is not supported")
    if "image" in inputs:
        raise InferdError(ErrorCode.UNSUPPORTED, "inferd's vllm backend does not take the 'image' input yet")
    text = inputs.get("text_input")
    if text is None:
        raise _invalid("expected input 'text_input'")
    prompt = _text(_first(text), "text_input")
    stream = bool(_first(inputs["stream"])) if "stream" in inputs else False
    exclude = inputs.get("exclude_input_in_output")
    # the prompt is prepended unless excluded; a streamed request never gets it (vllm_backend)
    prepend = (not bool(_first(exclude))) if exclude is not None else not stream
    if prepend and stream:
        raise _invalid("When streaming, `exclude_input_in_output` = False is not allowed.")
    raw = inputs.get("sampling_parameters")
    text_params = _text(_first(raw), "sampling_parameters") if raw is not None else (request.parameters or "{}")
    try:
        parameters = json.loads(text_params) if text_params.strip() else {}
    except ValueError as exc:
        raise _invalid("sampling_parameters is not valid JSON: %s" % exc) from None
    if not isinstance(parameters, dict):
        raise _invalid("sampling_parameters must be a JSON object, got %s" % type(parameters).__name__)
    flags = {name: bool(_first(inputs[name])) if name in inputs else False for name in RETURN_FLAGS}
    return Asked(prompt, stream, prepend, parameters, flags)


# ---- sampling parameters -------------------------------------------------------------------------

def _base_type(annotation: Any) -> Any:
    """int / float / bool / str for an annotation like `int`, `Optional[float]`, `int | None`; else None."""
    if annotation in (int, float, bool, str):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and args[0] in (int, float, bool, str):
        return args[0]
    return None


def _convert(key: str, value: Any, kind: Any) -> Any:
    """Strings (Triton clients send '"max_tokens": "16"') to the parameter's type."""
    if kind is None or value is None or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
        return value
    if kind is bool:
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return value.strip().lower() in ("true", "1")
        if isinstance(value, (int, float)):
            return bool(value)
        raise _invalid("sampling parameter '%s' must be a boolean, got %r" % (key, value))
    try:
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise _invalid("sampling parameter '%s' must be %s, got %r" % (key, kind.__name__, value)) from None


@functools.lru_cache(maxsize=4)
def _fields(vllm_sampling: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """SamplingParams' field types and names, read once (typing.get_type_hints takes ~0.6 ms: every request
    paid it, holding the worker's interpreter from the engine's output loop)."""
    try:
        hints = typing.get_type_hints(vllm_sampling)
    except Exception:  # noqa: BLE001 - annotations that do not resolve: convert nothing
        hints = dict(getattr(vllm_sampling, "__annotations__", {}))
    return hints, frozenset(getattr(vllm_sampling, "__struct_fields__", ())) or frozenset(hints)


def sampling_params(vllm_sampling: Any, parameters: dict[str, Any], structured: Any = None) -> Any:
    """A vllm SamplingParams from the request's parameters; INVALID_ARG naming the parameter that vLLM or
    the type conversion refuses (`vllm_sampling`: the SamplingParams class; `structured`:
    StructuredOutputsParams, for 'structured_outputs' given as a JSON string or object)."""
    hints, known = _fields(vllm_sampling)
    kwargs: dict[str, Any] = {}
    for key, value in parameters.items():
        if key not in known or key.startswith("_"):
            raise _invalid("unknown sampling parameter '%s'" % key)
        if key == "structured_outputs" and structured is not None and value is not None:
            try:
                value = structured(**(json.loads(value) if isinstance(value, str) else value))
            except Exception as exc:  # noqa: BLE001 - whatever vLLM refused, named
                raise _invalid("invalid sampling parameter 'structured_outputs': %s" % exc) from None
        else:
            value = _convert(key, value, _base_type(hints.get(key)))
        kwargs[key] = value
    try:
        return vllm_sampling(**kwargs)
    except Exception as exc:  # noqa: BLE001 - ValueError, TypeError, vLLM's VLLMValidationError: the client's
        raise _invalid("invalid sampling parameters: %s" % (_name_parameter(exc, kwargs),)) from None


def _name_parameter(exc: Exception, kwargs: dict[str, Any]) -> str:
    """vLLM's message, with the parameter it is about named in front when vLLM's text does not say it."""
    message = str(exc)
    parameter = getattr(exc, "parameter", None)
    if isinstance(parameter, str) and parameter and parameter not in message:
        return "'%s': %s" % (parameter, message)
    if any(key in message for key in kwargs):
        return message
    return message + " (parameters given: %s)" % ", ".join(sorted(kwargs))


# ---- responses -------------------------------------------------------------------------------------

def _bytes_array(values: list[bytes]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


class ResponseBuilder:
    """The response tensors of one request from vLLM's RequestOutputs: a streamed request gets what is new
    since the previous response (text, logprobs, token counts), as vllm_backend sends it. `delta`: the outputs
    hold only what is new (RequestOutputKind.DELTA, one sequence), else they are cumulative."""

    __slots__ = ("asked", "wanted", "_text_lens", "_token_lens", "_logprob_lens", "_first", "_delta")

    def __init__(self, asked: Asked, requested_outputs: list[str], delta: bool = False) -> None:
        self.asked = asked
        self.wanted = frozenset(requested_outputs) if requested_outputs else None
        self._delta = delta
        self._text_lens: list[int] = []
        self._token_lens: list[int] = []
        self._logprob_lens: list[int] = []
        self._first = True

    def _want(self, name: str) -> bool:
        return self.wanted is None or name in self.wanted

    def response(self, out: Any, prepend_input: bool) -> Response:
        if self._delta:
            return self._delta_response(out)
        seqs = out.outputs
        n = len(seqs)
        if self._first:
            self._text_lens, self._token_lens, self._logprob_lens = [0] * n, [0] * n, [0] * n
        while len(self._text_lens) < n:  # (a sequence that appears later)
            self._text_lens.append(0)
            self._token_lens.append(0)
            self._logprob_lens.append(0)
        prefix = (out.prompt or "") if (prepend_input and self._first) else ""
        self._first = False
        flags = self.asked.flags
        tensors = []
        if self._want("text_output"):
            texts = [(prefix + s.text[self._text_lens[i]:]).encode("utf-8") for i, s in enumerate(seqs)]
            tensors.append(Tensor("text_output", "BYTES", _bytes_array(texts)))
        self._text_lens = [len(s.text) for s in seqs]
        if flags["return_finish_reason"] and self._want("finish_reason"):
            reasons = [str(s.finish_reason).encode("utf-8") for s in seqs]
            tensors.append(Tensor("finish_reason", "BYTES", _bytes_array(reasons)))
        if flags["return_cumulative_logprob"] and self._want("cumulative_logprob"):
            values = [np.nan if s.cumulative_logprob is None else s.cumulative_logprob for s in seqs]
            tensors.append(Tensor("cumulative_logprob", "FP32", np.asarray(values, dtype=np.float32)))
        if flags["return_logprobs"] and self._want("logprobs"):
            tensors.append(Tensor("logprobs", "BYTES", _bytes_array(self._logprobs(seqs))))
        if flags["return_num_input_tokens"] and self._want("num_input_tokens"):
            count = len(out.prompt_token_ids or ())
            tensors.append(Tensor("num_input_tokens", "UINT32", np.asarray([count], dtype=np.uint32)))
        if flags["return_num_output_tokens"] and self._want("num_output_tokens"):
            counts = [len(s.token_ids) - self._token_lens[i] for i, s in enumerate(seqs)]
            tensors.append(Tensor("num_output_tokens", "UINT32", np.asarray(counts, dtype=np.uint32)))
        self._token_lens = [len(s.token_ids) for s in seqs]
        return Response(tensors)

    def _delta_response(self, out: Any) -> Response:
        """A DELTA output (streamed, one sequence, never the prompt prepended): taken as it is."""
        flags = self.asked.flags
        tensors = []
        seqs = out.outputs
        if self._want("text_output"):
            tensors.append(Tensor("text_output", "BYTES", _bytes_array([s.text.encode("utf-8") for s in seqs])))
        if flags["return_finish_reason"] and self._want("finish_reason"):
            reasons = [str(s.finish_reason).encode("utf-8") for s in seqs]
            tensors.append(Tensor("finish_reason", "BYTES", _bytes_array(reasons)))
        if flags["return_cumulative_logprob"] and self._want("cumulative_logprob"):
            values = [np.nan if s.cumulative_logprob is None else s.cumulative_logprob for s in seqs]
            tensors.append(Tensor("cumulative_logprob", "FP32", np.asarray(values, dtype=np.float32)))
        if flags["return_logprobs"] and self._want("logprobs"):
            self._logprob_lens = [0] * len(seqs)  # (each delta's logprobs are new)
            tensors.append(Tensor("logprobs", "BYTES", _bytes_array(self._logprobs(seqs))))
        if flags["return_num_input_tokens"] and self._want("num_input_tokens"):
            count = len(out.prompt_token_ids or ())
            tensors.append(Tensor("num_input_tokens", "UINT32", np.asarray([count], dtype=np.uint32)))
        if flags["return_num_output_tokens"] and self._want("num_output_tokens"):
            counts = [len(s.token_ids) for s in seqs]
            tensors.append(Tensor("num_output_tokens", "UINT32", np.asarray(counts, dtype=np.uint32)))
        return Response(tensors)

    def _logprobs(self, seqs: Any) -> list[bytes]:
        items = []
        for i, s in enumerate(seqs):
            if s.logprobs is None:
                items.append(b"null")
                continue
            new = s.logprobs[self._logprob_lens[i]:]
            self._logprob_lens[i] = len(s.logprobs)
            positions = [{str(token): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
                          for token, lp in position.items()} for position in new]
            items.append(json.dumps(positions).encode("utf-8"))
        return items
