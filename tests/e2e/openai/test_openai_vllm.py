"""The vLLM convention (--openai-backend vllm, as Triton's --backend vllm) on a model with the vLLM
backend's inputs: what reaches the model (text_input, stream, sampling_parameters JSON, the echo flag, the
return_* flags), token counts, streaming, the mistral tool-call parser, embeddings the vLLM way, and
Triton's vLLM-only refusals."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai_servers
import pytest

openai = pytest.importorskip("openai")

MODEL = "llm_vllm"


def embed(text):  # the fixtures' embedding (tests/fixtures/models/vllm_embed)
    out = [0.0] * 8
    for i, ch in enumerate(text):
        out[i % 8] += ord(ch) / 1000.0
    return out


@pytest.fixture(scope="module")
def vllm_server(module_server_factory, harness):
    return openai_servers.vllm(module_server_factory, harness)


def post(srv, path, body):
    return httpx.post(srv.base + path, json=body, timeout=30)


def test_what_the_model_is_sent(vllm_server):
    body = {"model": MODEL, "prompt": "INPUTS?", "max_tokens": 300, "temperature": 0.5, "stop": "zz",
            "seed": 3, "top_k": 2, "min_tokens": 1}
    text = post(vllm_server, "/v1/completions", body).json()["choices"][0]["text"]
    sent = json.loads(text)
    assert sent["stream"] is False and sent["exclude_input_in_output"] is True
    assert sent["return_num_input_tokens"] is True and sent["return_num_output_tokens"] is True
    assert sent["return_logprobs"] is False
    assert sent["sampling_parameters"] == {"max_tokens": 300, "temperature": 0.5, "stop": ["zz"], "seed": 3,
                                           "top_k": 2, "min_tokens": 1}


def test_chat_structured_output_goes_in_sampling_parameters(vllm_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    r = post(vllm_server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "INPUTS?"}],
                                                   "response_format": fmt, "max_tokens": 300})
    sent = json.loads(r.json()["choices"][0]["message"]["content"])
    assert json.loads(sent["sampling_parameters"]["structured_outputs"]) == {"json": {"type": "object"}}


@pytest.mark.parametrize("echo", [False, True])
def test_echo_is_the_models(vllm_server, echo):
    text = post(vllm_server, "/v1/completions", {"model": MODEL, "prompt": "SAY: hi:END", "echo": echo}).json()
    assert text["choices"][0]["text"] == ("SAY: hi:END hi" if echo else " hi")


def test_usage_and_streaming(vllm_server):
    c = vllm_server.client()
    plain = c.completions.create(model=MODEL, prompt="COUNT:5")
    assert plain.usage.prompt_tokens == 1 and plain.usage.completion_tokens == 5
    chunks = list(c.completions.create(model=MODEL, prompt="COUNT:5", stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == plain.choices[0].text
    assert chunks[-1].usage.model_dump() == plain.usage.model_dump()


@pytest.mark.parametrize("extra, message", [
    ({"best_of": 1}, "best_of is no longer supported in vLLM backend"),
    ({"best_of": 2}, "best_of is no longer supported in vLLM backend"),
])
def test_vllm_refusals(vllm_server, extra, message):
    r = post(vllm_server, "/v1/completions", {"model": MODEL, "prompt": "x", **extra})
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_top_logprobs_requires_logprobs(vllm_server):
    for value in (0, 5):
        r = post(vllm_server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                       "top_logprobs": value})
        assert r.status_code == 400
        assert "`top_logprobs` can only be used when `logprobs` is True" in r.json()["error"]["message"]


def test_mistral_tool_calls(vllm_server):
    c = vllm_server.client()
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dallas"}}]'
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    kw = {"model": MODEL, "messages": [{"role": "user", "content": f"SAY:{text}:END"}], "tools": tools,
          "max_tokens": 100}
    plain = c.chat.completions.create(**kw)
    call = plain.choices[0].message.tool_calls[0]
    assert plain.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Dallas"}
    args, finishes = "", []
    for chunk in c.chat.completions.create(stream=True, **kw):
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            args += delta_call.function.arguments or ""
        finishes += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    assert json.loads(args) == {"city": "Dallas"} and finishes == ["tool_calls"]


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_vllm_embeddings(vllm_server, encoding):
    c = vllm_server.client()
    text = "The food was delicious and the waiter..."
    result = c.embeddings.create(model="vllm_embed", input=text, encoding_format=encoding)
    vector = result.data[0].embedding
    if isinstance(vector, str):
        vector = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
    assert np.allclose(vector, embed(text), atol=1e-5)
    assert result.usage.prompt_tokens == len(text.split()) and result.model == "vllm_embed"


def test_vllm_embeddings_token_ids_and_dimensions(vllm_server):
    r = post(vllm_server, "/v1/embeddings", {"model": "vllm_embed", "input": [72, 105], "dimensions": 3})
    body = r.json()
    assert r.status_code == 200, r.text
    assert np.allclose(body["data"][0]["embedding"], embed("Hi")[:3]) and body["usage"]["prompt_tokens"] == 2
