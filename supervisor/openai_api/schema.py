"""The request bodies of /v1/completions, /v1/chat/completions and /v1/embeddings checked against the
fields, types and ranges of the OpenAI API reference as Triton's OpenAI frontend declares them (its
pydantic schema, extensions `min_tokens` and `ignore_eos` included). A body that does not fit is refused
422 naming the field, in pydantic's words where Triton's tests pin them ("Field required", "Input should be
less than or equal to 20", ...). What passes comes back as the parsed dict, unchanged.

Fields OpenAI defines that change nothing here (user, metadata, store, service_tier, ...) are accepted and
ignored; any other field is refused, as Triton refuses it (extra="forbid").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import orjson

from .errors import OpenAIError, bad_request, invalid_body

Check = Callable[[str, Any], None]
_INT64 = (-(2**63), 2**63 - 1)


def load(body: Any) -> dict[str, Any]:
    """The JSON object of a request body; 400 for JSON that does not parse, 422 for another value."""
    try:
        doc = orjson.loads(body)
    except (orjson.JSONDecodeError, RecursionError, ValueError) as exc:
        raise bad_request(f"malformed JSON in the request body: {exc}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise invalid_body("the request body must be a JSON object")
    return doc


# ---- field checks -------------------------------------------------------------------------------------


def _fail(name: str, message: str) -> OpenAIError:
    return invalid_body(f"{name}: {message}", param=name)


def string(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _fail(name, "Input should be a valid string")


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(name, "Input should be a valid boolean")


def integer(ge: int | None = None, le: int | None = None) -> Check:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise _fail(name, "Input should be a valid integer")
        if ge is not None and value < ge:
            raise _fail(name, f"Input should be greater than or equal to {ge}")
        if le is not None and value > le:
            raise _fail(name, f"Input should be less than or equal to {le}")
        if not _INT64[0] <= value <= _INT64[1]:  # (a model's tensors and vLLM's JSON hold 64 bits at most)
            raise _fail(name, f"Input should be less than or equal to {_INT64[1]}" if value > 0 else
                        f"Input should be greater than or equal to {_INT64[0]}")
    return check


def number(ge: float, le: float) -> Check:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(name, "Input should be a valid number")
        if value < ge:
            raise _fail(name, f"Input should be greater than or equal to {ge}")
        if value > le:
            raise _fail(name, f"Input should be less than or equal to {le}")
    return check


def stop(name: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(name, "Input should be a valid string or a list of strings")


def obj(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _fail(name, "Input should be a valid dictionary")


def anything(name: str, value: Any) -> None:
    return None


def stream_options(name: str, value: Any) -> None:
    obj(name, value)
    for key, item in value.items():
        if key != "include_usage":
            raise _fail(f"{name}.{key}", "Extra inputs are not permitted")
        boolean(f"{name}.include_usage", item)


def logit_bias(name: str, value: Any) -> None:
    obj(name, value)
    for key, item in value.items():
        integer()(f"{name}.{key}", item)


def prompt(name: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list):  # lists are well-formed prompts; the route refuses them (one string only)
        return
    raise _fail(name, "Input should be a valid string")


def embedding_input(name: str, value: Any) -> None:
    if isinstance(value, list):
        if not value:
            raise _fail(name, "Value should have at least 1 item after validation, not 0")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return
        if all(isinstance(v, str) for v in value):
            return
        raise _fail(name, "Input should be a valid string")
    if not isinstance(value, str):
        raise _fail(name, "Input should be a valid string")
    if not value:
        raise _fail(name, "Value should have at least 1 item after validation, not 0")


_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def messages(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise _fail(name, "Input should be a valid list")
    if not value:
        raise _fail(name, "List should have at least 1 item after validation, not 0")
    for i, message in enumerate(value):
        where = f"{name}.{i}"
        if not isinstance(message, dict):
            raise _fail(where, "Input should be a valid dictionary")
        role = message.get("role")
        if role is None:
            raise _fail(f"{where}.role", "Field required")
        if role not in _ROLES:
            raise _fail(f"{where}.role", f"Input should be one of {', '.join(repr(r) for r in _ROLES)}")
        content = message.get("content")
        if "content" not in message and role != "assistant":
            raise _fail(f"{where}.content", "Field required")
        if content is not None and not isinstance(content, str):
            if not isinstance(content, list):
                raise _fail(f"{where}.content", "Input should be a valid string")
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise _fail(f"{where}.content.{j}", "Input should be a content part object with a 'type'")
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise _fail(f"{where}.content.{j}.text", "Field required")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise _fail(f"{where}.tool_call_id", "Field required")
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _fail(f"{where}.tool_calls", "Input should be a valid list")
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                        or not isinstance(fn.get("arguments"), str):
                    raise _fail(f"{where}.tool_calls.{j}.function", "Field required (name and arguments strings)")


def tools(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise _fail(name, "Input should be a valid list")
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _fail(f"{name}.{i}.function.name", "Field required")
        if tool.get("type", "function") != "function":
            raise _fail(f"{name}.{i}.type", "Input should be 'function'")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _fail(f"{name}.{i}.function.parameters", "Input should be a valid dictionary")


def tool_choice(name: str, value: Any) -> None:
    if value in ("none", "auto", "required"):
        return
    fn = value.get("function") if isinstance(value, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _fail(name, "Input should be 'none', 'auto', 'required' or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}")


def response_format(name: str, value: Any) -> None:
    obj(name, value)
    kind = value.get("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        raise _fail(f"{name}.type", "Input should be 'text', 'json_object' or 'json_schema'")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
            raise _fail(f"{name}.json_schema", "Field required")
        if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
            raise _fail(f"{name}.json_schema.schema", "Input should be a valid dictionary")


def encoding_format(name: str, value: Any) -> None:
    if value not in ("float", "base64"):
        raise _fail(name, "Input should be 'float' or 'base64'")


# ---- the three bodies -----------------------------------------------------------------------------------

_SAMPLING: dict[str, Check] = {
    "model": string,
    "frequency_penalty": number(-2.0, 2.0),
    "presence_penalty": number(-2.0, 2.0),
    "temperature": number(0.0, 2.0),
    "top_p": number(0.0, 1.0),
    "top_k": integer(),  # vLLM's extension
    "repetition_penalty": number(0.0, math.inf),  # vLLM's extension
    "max_tokens": integer(ge=0),
    "min_tokens": integer(ge=0),
    "ignore_eos": boolean,
    "n": integer(ge=1, le=128),
    "seed": integer(*_INT64),
    "stop": stop,
    "stream": boolean,
    "stream_options": stream_options,
    "logit_bias": logit_bias,
    "user": string,
    "metadata": anything,
    "store": anything,
    "service_tier": anything,
}

COMPLETION: dict[str, Check] = {
    **_SAMPLING,
    "prompt": prompt,
    "best_of": integer(ge=0, le=20),
    "echo": boolean,
    "logprobs": integer(ge=0, le=5),
    "suffix": anything,
}

CHAT: dict[str, Check] = {
    **_SAMPLING,
    "messages": messages,
    "logprobs": boolean,
    "top_logprobs": integer(ge=0, le=20),
    "max_completion_tokens": integer(ge=0),
    "response_format": response_format,
    "tools": tools,
    "tool_choice": tool_choice,
    "parallel_tool_calls": boolean,
    "function_call": anything,
    "functions": anything,
}

EMBEDDING: dict[str, Check] = {
    "model": string,
    "input": embedding_input,
    "dimensions": integer(ge=1),
    "encoding_format": encoding_format,
    "user": string,
}

_REQUIRED = {id(COMPLETION): ("model", "prompt"), id(CHAT): ("messages", "model"), id(EMBEDDING): ("input", "model")}


def check(doc: dict[str, Any], fields: dict[str, Check]) -> dict[str, Any]:
    """`doc` when every field fits `fields` (None counts as absent, as pydantic's Optional); else 422."""
    for name in _REQUIRED[id(fields)]:
        if doc.get(name) is None:
            raise _fail(name, "Field required" if name not in doc else "Input should be a valid string")
    for name, value in doc.items():
        checker = fields.get(name)
        if checker is None:
            raise _fail(name, "Extra inputs are not permitted")
        if value is not None:
            checker(name, value)
    return doc
