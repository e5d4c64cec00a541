"""A chat request read for the model: the checks Triton's frontend makes (its messages), the conversation
the chat template renders, the tool choice, and the structured output it asks for.

Tool choice, as Triton's frontend has it: a named function, or "required" (the first tool), makes the
model's whole text that function's arguments, guided by its parameters' JSON schema where the model takes
guided decoding; "auto" (or tools without a tool_choice) reads tool calls out of the text with the
--tool-call-parser; "none" passes no tools to the template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .catalog import ModelInfo
from .conventions import VLLM, supports_guided
from .errors import bad_request


@dataclass
class ToolMode:
    forced: str | None = None  # the function whose arguments the whole text is (named / required)
    auto: bool = False  # tool calls are parsed out of the text
    schema: Any = None  # the forced function's parameters


def check(body: dict[str, Any], info: ModelInfo, parser: str) -> None:
    """Triton's refusals, in its order (after the tokenizer's, which the caller makes)."""
    n = body.get("n")
    if n is not None and n > 1:
        raise bad_request(f"Received n={n}, but only single choice (n=1) is currently supported", param="n")
    if body.get("logit_bias") is not None:
        raise bad_request("logit bias is not currently supported", param="logit_bias")
    if info.inputs.convention != VLLM and (body.get("logprobs") or body.get("top_logprobs") is not None):
        raise bad_request("logprobs are currently available only for the vLLM backend", param="logprobs")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        raise bad_request("`top_logprobs` can only be used when `logprobs` is True", param="top_logprobs")
    choice, tools = body.get("tool_choice"), body.get("tools")
    if choice == "required" and not tools:
        raise bad_request('"required" tool choice requires CreateChatCompletionRequest.tools to be provided',
                          param="tool_choice")
    if isinstance(choice, dict) and not tools:
        raise bad_request("Named tool choice requires CreateChatCompletionRequest.tools to be provided",
                          param="tool_choice")
    if choice == "auto" and not parser:
        raise bad_request('"auto" tool choice requires --tool-call-parser to be set', param="tool_choice")
    if choice is None and tools and not parser:
        raise bad_request("having tools in the request requires --tool-call-parser to be set", param="tools")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise bad_request("`stream_options` can only be used when `stream` is True", param="stream_options")


def tool_mode(body: dict[str, Any], parser: str) -> ToolMode:
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    name = None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
    elif choice == "required":
        name = tools[0]["function"]["name"]
    if name is not None:
        found = [t["function"] for t in tools if t["function"]["name"] == name]
        if not found:
            raise bad_request(f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
        return ToolMode(forced=name, schema=found[0].get("parameters") or {"type": "object"})
    return ToolMode(auto=bool(tools) and bool(parser) and choice in (None, "auto"))


def guide(body: dict[str, Any], info: ModelInfo, mode: ToolMode) -> tuple[tuple[str, Any] | None, bool]:
    """The structured output asked for: (("json", schema) | ("json_object", None) | None, optional). A
    response_format the model cannot honour is refused here; a forced tool's schema is optional."""
    fmt = body.get("response_format") or {}
    kind = fmt.get("type", "text")
    if kind in ("json_object", "json_schema"):
        if not supports_guided(info.inputs):
            raise bad_request(f"model '{info.name}' cannot honour response_format {kind!r}: it takes no guided "
                              "decoding (a vLLM model, or inputs guided_decoding_guide_type and "
                              "guided_decoding_guide)", param="response_format")
        if kind == "json_object":
            return ("json_object", None), False
        return ("json", (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}), False
    if mode.forced is not None:
        return ("json", mode.schema), True
    return None, False


def conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates read them: text parts joined (templates expect a string), nothing the
    template does not need."""
    out = []
    for message in messages:
        role = message["role"]
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text":
                    raise bad_request(f"only text message is supported, but got {part.get('type')}",
                                      param="messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        item: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and message.get("tool_calls"):
            item["tool_calls"] = message["tool_calls"]  # (tokenizer.py gives templates the arguments as objects)
        if role == "tool":
            item["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            item["name"] = message["name"]
        out.append(item)
    return out
