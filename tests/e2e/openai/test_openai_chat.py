"""POST /v1/chat/completions against a real server: the chat template of the model's own tokenizer (built
by the test), the SDK sync / async / streamed, tools with tool_choice auto / none / required / named
(llama3 parser), response_format, and the cases of Triton's test_chat_completions.py, test_openai_client.py
and test_tool_calling.py that apply. The fixture models answer `SAY:<text>:END` with <text>, so a test
chooses what the "model" writes."""

from __future__ import annotations

import json

import httpx
import openai_servers
import pytest

openai = pytest.importorskip("openai")

MODEL = "llm_trtllm_counts"
MESSAGES = [{"role": "user", "content": "What is machine learning?"}]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "state": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "state", "unit"]}}}
FORECAST_TOOL = {"type": "function", "function": {
    "name": "get_n_day_weather_forecast", "description": "Get an N-day weather forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "num_days": {"type": "integer"}},
                   "required": ["city", "num_days"]}}}
WEATHER_ARGS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
CALL_TEXT = json.dumps({"name": "get_current_weather", "parameters": WEATHER_ARGS})


def say(text):
    return [{"role": "user", "content": f"SAY:{text}:END"}]


@pytest.fixture(scope="module")
def main_server(module_server_factory, harness):
    return openai_servers.main(module_server_factory, harness)


def post(srv, body):
    return httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=30)


def test_defaults(main_server):
    r = post(main_server, {"model": MODEL, "messages": say("hello there")})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello there"}
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == 2 and usage["total_tokens"] == \
        usage["prompt_tokens"] + 2


def test_the_prompt_is_the_chat_template_rendered(main_server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = post(main_server, {"model": "llm_trtllm", "messages": messages, "max_tokens": 100}).json()
    # the fixture echoes an ordinary prompt: the reply is the template's output
    reply = body["choices"][0]["message"]["content"]
    assert reply.startswith("<|begin_of_text|>") and "system<|end_header_id|>" in reply
    assert "Be brief." in reply and reply.rstrip().endswith("assistant<|end_header_id|>")


@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": "You are an expert."}, {"role": "user", "content": "SAY:ok:END"}],
    [{"role": "system", "content": "SAY:ok:END"}],
    [{"role": "user", "content": [{"type": "text", "text": "SAY:ok:END"}]}],
    [{"role": "developer", "content": "SAY:ok:END"}],
])
def test_message_forms(main_server, messages):
    r = post(main_server, {"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize("key, value", [("temperature", 0.7), ("max_tokens", 10), ("max_completion_tokens", 10),
                                        ("top_p", 0.9), ("frequency_penalty", 0.5), ("presence_penalty", 0.2),
                                        ("n", 1), ("stop", "."), ("stop", []), ("stop", [".", ","]),
                                        ("min_tokens", 16), ("ignore_eos", True), ("logprobs", False),
                                        ("user", "u1"), ("parallel_tool_calls", True)])
def test_sampling_parameters_accepted(main_server, key, value):
    r = post(main_server, {"model": MODEL, "messages": say("fine words"), key: value})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("key, value", [("temperature", 2.1), ("temperature", -0.1), ("max_tokens", -1),
                                        ("max_completion_tokens", -1), ("top_p", 1.1), ("frequency_penalty", 3),
                                        ("frequency_penalty", -3), ("presence_penalty", 2.1),
                                        ("presence_penalty", -2.1), ("min_tokens", -1), ("ignore_eos", 123),
                                        ("top_logprobs", 25), ("tool_choice", "sometimes")])
def test_invalid_sampling_parameters_422(main_server, key, value):
    r = post(main_server, {"model": MODEL, "messages": MESSAGES, key: value})
    assert r.status_code == 422, r.text
    assert key in r.json()["error"]["message"]


@pytest.mark.parametrize("messages, message", [([], "List should have at least 1 item after validation, not 0"),
                                               ([{}], "Field required")])
def test_bad_messages_422(main_server, messages, message):
    r = post(main_server, {"model": MODEL, "messages": messages})
    assert r.status_code == 422 and message in r.json()["error"]["message"]


@pytest.mark.parametrize("extra, message", [
    ({"n": 2}, "only single choice"),
    ({"logit_bias": {"0": 0}}, "logit bias is not currently supported"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs are currently available only for the vLLM backend"),
    ({"stream_options": {"include_usage": True}}, "`stream_options` can only be used when `stream` is True"),
    ({"tool_choice": "required", "tools": []}, '"required" tool choice requires'),
    ({"tool_choice": {"type": "function", "function": {"name": "get_n_day_weather_forecast"}}},
     "Named tool choice requires"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_n_day_weather_forecast"}},
      "tools": [WEATHER_TOOL]}, "Tool 'get_n_day_weather_forecast' has not been passed in `tools`."),
    ({"response_format": {"type": "json_object"}}, "cannot honour response_format"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
      "max_tokens": 1}, "only text message is supported"),
])
def test_refusals_400(main_server, extra, message):
    r = post(main_server, {"model": MODEL, "messages": MESSAGES, **extra})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_max_completion_tokens_wins_over_max_tokens(main_server):
    r = post(main_server, {"model": MODEL, "messages": say("a b c d e"), "max_tokens": 50,
                           "max_completion_tokens": 1})
    assert r.json()["choices"][0]["message"]["content"].split() == ["a"]
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_model_without_tokenizer_500(main_server):
    r = post(main_server, {"model": "vllm_embed", "messages": MESSAGES})
    assert r.status_code == 500 and r.json()["error"]["message"].startswith("Unknown tokenizer")


def test_unknown_model_404(main_server):
    assert post(main_server, {"model": "nope", "messages": MESSAGES}).status_code == 404


# ---- the SDK -------------------------------------------------------------------------------------------


def test_sdk_sync(main_server):
    c = main_server.client()
    completion = c.chat.completions.create(model=MODEL, messages=say("hello world"))
    assert completion.choices[0].message.content == "hello world"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


@pytest.mark.parametrize("extra", [{}, {"stop": "is"}, {"stop": ["is"]}, {"stop": ["is", ".", ","]}])
async def test_sdk_streaming_matches_plain(main_server, extra):
    c = main_server.async_client()
    messages = say("Some words go first, and more follow. That is all.")
    plain = await c.chat.completions.create(model="llm_trtllm", messages=messages, max_completion_tokens=64,
                                            temperature=0.0, seed=0, **extra)
    stream = await c.chat.completions.create(model="llm_trtllm", messages=messages, max_completion_tokens=64,
                                             temperature=0.0, seed=0, stream=True, **extra)
    chunks, finishes, roles = [], [], []
    async for chunk in stream:
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        if delta.content:
            chunks.append(delta.content)
        if chunk.choices[0].finish_reason is not None:
            finishes.append(chunk.choices[0].finish_reason)
        assert chunk.usage is None
    assert roles == ["assistant"] and finishes == [plain.choices[0].finish_reason]
    assert len(chunks) > 1 and "".join(chunks) == plain.choices[0].message.content
    await c.close()


async def test_streaming_usage_option(main_server):
    c = main_server.async_client()
    plain = await c.chat.completions.create(model=MODEL, messages=say("one two three"), max_tokens=16)
    chunks = [ch async for ch in await c.chat.completions.create(
        model=MODEL, messages=say("one two three"), max_tokens=16, stream=True,
        stream_options={"include_usage": True})]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == plain.usage.model_dump()
    assert all(ch.usage is None for ch in chunks[:-1])
    await c.close()


# ---- tools (Triton's test_tool_calling.py, with the llama3 parser) --------------------------------------


async def test_tool_call_auto_plain_and_streamed(main_server):
    c = main_server.async_client()
    kw = {"model": MODEL, "messages": say(CALL_TEXT), "tools": [WEATHER_TOOL, FORECAST_TOOL],
          "max_completion_tokens": 128, "temperature": 0}
    plain = await c.chat.completions.create(**kw)
    calls = plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].type == "function" and len(calls[0].id) >= 9
    assert calls[0].function.name == "get_current_weather" and json.loads(calls[0].function.arguments) == WEATHER_ARGS
    name, args, ids, finishes, roles = None, "", [], [], []
    async for chunk in await c.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
        if choice.delta.role:
            roles.append(choice.delta.role)
        for call in choice.delta.tool_calls or []:
            if call.id:
                ids.append(call.id)
            if call.function and call.function.name:
                assert name is None
                name = call.function.name
            if call.function and call.function.arguments:
                args += call.function.arguments
    assert finishes == ["tool_calls"] and roles == ["assistant"] and len(ids) == 1 and len(ids[0]) >= 9
    assert name == "get_current_weather" and json.loads(args) == WEATHER_ARGS
    await c.close()


async def test_tool_result_answered_with_content(main_server):
    c = main_server.async_client()
    messages = [{"role": "user", "content": "SAY:It is 98 degrees in Dallas.:END"},
                {"role": "assistant", "tool_calls": [{"id": "123456789", "type": "function", "function": {
                    "name": "get_current_weather", "arguments": json.dumps(WEATHER_ARGS)}}]},
                {"role": "tool", "tool_call_id": "123456789", "content": "98"}]
    kw = {"model": MODEL, "messages": messages, "tools": [WEATHER_TOOL, FORECAST_TOOL], "seed": 0}
    plain = await c.chat.completions.create(**kw)
    assert plain.choices[0].finish_reason == "stop" and not plain.choices[0].message.tool_calls
    assert plain.choices[0].message.content == "It is 98 degrees in Dallas."
    chunks = []
    async for chunk in await c.chat.completions.create(stream=True, **kw):
        assert not chunk.choices[0].delta.tool_calls
        chunks.append(chunk.choices[0].delta.content or "")
    assert "".join(chunks) == plain.choices[0].message.content
    await c.close()


@pytest.mark.parametrize("choice, tool", [
    ({"type": "function", "function": {"name": "get_n_day_weather_forecast"}}, "get_n_day_weather_forecast"),
    ("required", "get_current_weather")])
async def test_forced_tool_choice(main_server, choice, tool):
    c = main_server.async_client()
    args = {"city": "Dallas", "num_days": 1}
    kw = {"model": MODEL, "messages": say(json.dumps(args)), "tools": [WEATHER_TOOL, FORECAST_TOOL],
          "tool_choice": choice, "max_completion_tokens": 128}
    plain = await c.chat.completions.create(**kw)
    calls = plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason != "tool_calls" and len(calls) == 1
    assert calls[0].function.name == tool and json.loads(calls[0].function.arguments) == args
    names, streamed, ids = set(), "", []
    async for chunk in await c.chat.completions.create(stream=True, **kw):
        for call in chunk.choices[0].delta.tool_calls or []:
            ids += [call.id] if call.id else []
            names |= {call.function.name} if call.function.name else set()
            streamed += call.function.arguments or ""
    assert names == {tool} and len(ids) == 1 and json.loads(streamed) == args
    await c.close()


def test_forced_tool_choice_guides_the_model(main_server):
    """The forced function's parameters reach a model that takes guided decoding as a JSON schema."""
    r = post(main_server, {"model": "llm_trtllm", "messages": [{"role": "user", "content": "INPUTS?"}],
                           "tools": [FORECAST_TOOL], "tool_choice": "required", "max_tokens": 500})
    sent = json.loads(r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert sent["guided_decoding_guide_type"] == "json_schema"
    assert json.loads(sent["guided_decoding_guide"]) == FORECAST_TOOL["function"]["parameters"]


def test_tool_choice_none_is_plain_content(main_server):
    r = post(main_server, {"model": MODEL, "messages": say(CALL_TEXT), "tools": [WEATHER_TOOL],
                           "tool_choice": "none", "max_tokens": 100})
    message = r.json()["choices"][0]["message"]
    assert message["content"] == CALL_TEXT and "tool_calls" not in message


@pytest.mark.parametrize("fmt, kind, guide", [
    ({"type": "json_object"}, "json", ""),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}, "json_schema",
     {"type": "object"})])
def test_response_format_is_guided_decoding(main_server, fmt, kind, guide):
    r = post(main_server, {"model": "llm_trtllm", "messages": [{"role": "user", "content": "INPUTS?"}],
                           "response_format": fmt, "max_tokens": 500})
    sent = json.loads(r.json()["choices"][0]["message"]["content"])
    assert sent["guided_decoding_guide_type"] == kind
    assert (json.loads(sent["guided_decoding_guide"]) if guide else sent["guided_decoding_guide"]) == guide
