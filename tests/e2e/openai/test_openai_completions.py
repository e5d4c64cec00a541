"""POST /v1/completions against a real server with the official `openai` SDK and raw HTTP: the cases of
Triton's python/openai/tests/test_completions.py and test_openai_client.py that apply (docs/openai.md lists
those that do not), on TensorRT-LLM style fixture models that answer deterministically."""

from __future__ import annotations

import httpx
import openai_servers
import pytest

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def main_server(module_server_factory, harness):
    return openai_servers.main(module_server_factory, harness)

MODEL = "llm_trtllm_counts"  # returns num_input_tokens / num_output_tokens
PROMPT = "What is machine learning?"


def post(srv, body, path="/v1/completions"):
    return httpx.post(srv.base + path, json=body, timeout=30)


def test_defaults_and_usage(main_server):
    r = post(main_server, {"model": MODEL, "prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == PROMPT  # the fixture echoes a plain prompt
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_usage_from_the_tokenizer_when_the_model_does_not_count(main_server):
    body = post(main_server, {"model": "llm_trtllm", "prompt": PROMPT}).json()
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("key, value", [("temperature", 0.7), ("max_tokens", 10), ("top_p", 0.9),
                                        ("frequency_penalty", 0.5), ("presence_penalty", 0.2), ("n", 1),
                                        ("min_tokens", 16), ("ignore_eos", True), ("seed", 3), ("stop", ".")])
def test_sampling_parameters_accepted(main_server, key, value):
    r = post(main_server, {"model": MODEL, "prompt": PROMPT, key: value})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].strip()


def test_parameters_reach_the_model_as_tensors(main_server):
    body = {"model": "llm_trtllm", "prompt": "INPUTS?", "max_tokens": 200, "temperature": 0.5, "top_p": 0.25,
            "seed": 7, "stop": ["zz", "yy"], "frequency_penalty": 0.5, "presence_penalty": -0.5, "top_k": 3}
    sent = __import__("json").loads(post(main_server, body).json()["choices"][0]["text"])
    assert sent == {"frequency_penalty": 0.5, "max_tokens": 200, "presence_penalty": -0.5, "seed": 7,
                    "stop_words": ["zz", "yy"], "stream": False, "temperature": 0.5, "top_k": 3, "top_p": 0.25}


def test_default_max_tokens_is_16(main_server):
    text = post(main_server, {"model": MODEL, "prompt": "COUNT:40"}).json()["choices"][0]["text"]
    assert text.split() == [str(i) for i in range(1, 17)]


def test_max_tokens_and_finish_reason_length(main_server):
    one = post(main_server, {"model": MODEL, "prompt": "COUNT:40", "max_tokens": 1}).json()["choices"][0]
    many = post(main_server, {"model": MODEL, "prompt": "COUNT:40", "max_tokens": 100}).json()["choices"][0]
    assert one["text"].split() == ["1"] and one["finish_reason"] == "length"
    assert len(many["text"].split()) == 40 and many["finish_reason"] == "stop"


@pytest.mark.parametrize("key, value", [("temperature", 2.1), ("temperature", -0.1), ("max_tokens", -1),
                                        ("top_p", 1.1), ("frequency_penalty", 3), ("frequency_penalty", -3),
                                        ("presence_penalty", 2.1), ("presence_penalty", -2.1),
                                        ("min_tokens", -1), ("ignore_eos", 123), ("logprobs", 7),
                                        ("unknown_field", 1)])
def test_invalid_sampling_parameters_422(main_server, key, value):
    r = post(main_server, {"model": MODEL, "prompt": PROMPT, key: value})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == key and key in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [{}, {"prompt": PROMPT}, {"model": MODEL}])
def test_missing_fields_422(main_server, body):
    r = post(main_server, body)
    assert r.status_code == 422 and "Field required" in r.json()["error"]["message"]


@pytest.mark.parametrize("extra, message", [
    ({"prompt": ""}, "prompt must be non-empty"),
    ({"prompt": ["a", "b"]}, "only single string input is supported"),
    ({"n": 2}, "only single choice"),
    ({"best_of": 2}, "only single choice"),
    ({"n": 2, "best_of": 2}, "only single choice"),
    ({"n": 2, "best_of": 1}, "only single choice"),
    ({"logit_bias": {"0": 0}}, "logit bias is not supported"),
    ({"logprobs": 3}, "logprobs are currently available only for the vLLM backend"),
    ({"suffix": "x"}, "suffix is not currently supported"),
    ({"stream_options": {"include_usage": True}}, "`stream_options` can only be used when `stream` is True"),
])
def test_refusals_400(main_server, extra, message):
    r = post(main_server, {"model": MODEL, "prompt": PROMPT, **extra})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_logprobs_zero_is_no_logprobs(main_server):
    r = post(main_server, {"model": MODEL, "prompt": PROMPT, "logprobs": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("echo", [False, True])
def test_echo_without_an_echo_input(main_server, echo):
    text = post(main_server, {"model": MODEL, "prompt": "SAY: reply:END", "echo": echo}).json()["choices"][0]["text"]
    assert text == ("SAY: reply:END reply" if echo else " reply")


def test_unknown_model_404(main_server):
    r = post(main_server, {"model": "nope", "prompt": PROMPT})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "Unknown model: nope", "type": "invalid_request_error",
                                  "param": "model", "code": "model_not_found"}}


def test_model_without_text_input_400(main_server):
    r = post(main_server, {"model": "identity", "prompt": PROMPT})
    assert r.status_code == 400 and "declares no input 'text_input'" in r.json()["error"]["message"]


def test_malformed_json_400(main_server):
    r = httpx.post(main_server.base + "/v1/completions", content=b'{"model": ', timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_model_error_response(main_server):
    r = post(main_server, {"model": MODEL, "prompt": "FAIL:boom:END"})
    assert r.status_code >= 400 and "boom" in r.json()["error"]["message"]


# ---- the SDK -------------------------------------------------------------------------------------------


def test_sdk_sync(main_server):
    c = main_server.client()
    completion = c.completions.create(model=MODEL, prompt=PROMPT)
    assert completion.choices[0].text == PROMPT and completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt=PROMPT)
    with pytest.raises(openai.BadRequestError, match="`stream_options` can only be used"):
        c.completions.create(model=MODEL, prompt=PROMPT, stream_options={"include_usage": True})
    with pytest.raises(openai.UnprocessableEntityError, match="less than or equal to 5"):
        c.completions.create(model=MODEL, prompt=PROMPT, logprobs=7)


async def test_sdk_async_streaming_matches_plain(main_server):
    c = main_server.async_client()
    plain = await c.completions.create(model=MODEL, prompt="COUNT:10", max_tokens=10, temperature=0.0, seed=0)
    stream = await c.completions.create(model=MODEL, prompt="COUNT:10", max_tokens=10, temperature=0.0, seed=0,
                                        stream=True)
    texts, finishes = [], []
    async for chunk in stream:
        texts.append(chunk.choices[0].text)
        if chunk.choices[0].finish_reason is not None:
            finishes.append(chunk.choices[0].finish_reason)
    assert len(texts) > 1 and "".join(texts) == plain.choices[0].text
    assert finishes == [plain.choices[0].finish_reason]
    await c.close()


@pytest.mark.parametrize("model", [MODEL, "llm_trtllm"])
async def test_streaming_usage_option(main_server, model):
    c = main_server.async_client()
    plain = await c.completions.create(model=model, prompt="COUNT:16", max_tokens=16)
    without = [ch async for ch in await c.completions.create(model=model, prompt="COUNT:16", max_tokens=16,
                                                             stream=True, stream_options={"include_usage": False})]
    with_usage = [ch async for ch in await c.completions.create(model=model, prompt="COUNT:16", max_tokens=16,
                                                                stream=True, stream_options={"include_usage": True})]
    assert all(ch.usage is None for ch in without)
    assert len(with_usage) == len(without) + 1
    assert with_usage[-1].choices == [] and all(ch.usage is None for ch in with_usage[:-1])
    assert "".join(ch.choices[0].text for ch in with_usage[:-1]) == plain.choices[0].text
    assert with_usage[-1].usage.model_dump() == plain.usage.model_dump()
    await c.close()


def test_stream_ends_with_done(main_server):
    with httpx.stream("POST", main_server.base + "/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": "COUNT:3", "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and len(events) == 5  # 3 tokens, the finish, [DONE]


def test_error_after_the_stream_began_is_an_error_event(main_server):
    with httpx.stream("POST", main_server.base + "/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": "SAY:a b:END FAIL:late:END", "stream": True}) as r:
        events = [line for line in r.iter_lines() if line]
    assert any('"error"' in e and "late" in e for e in events)
    assert events[-1] == "data: [DONE]"
