"""The language-model fixtures (tests/fixtures/models/llm_*, helpers in tests/openai_support.py) answer as
their docstring says, checked through Triton's generate extension so that the OpenAI frontend's tests can
rely on them: replies chosen by the prompt, max_tokens and stop words, token counts, the vLLM convention,
a token cadence, cancellation."""

from __future__ import annotations

import json
import time

import httpx
import openai_support  # tests/ is on sys.path through the root conftest
import pytest

WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(module_server_factory, tmp_path_factory):
    repo = module_server_factory.make_repo({**{m: m for m in openai_support.LLM_FIXTURES}, "llm_slow": "llm_trtllm"})
    cancel_dir = tmp_path_factory.mktemp("cancelled")
    openai_support.set_parameters(repo / "llm_slow", {"token_delay_ms": "20", "cancel_dir": str(cancel_dir)})
    openai_support.set_parameters(repo / "llm_slow", {"token_delay_ms": "25"})  # replaced, not added
    srv = module_server_factory(list(openai_support.LLM_FIXTURES) + ["llm_slow"], repo=repo)
    srv.cancel_dir = cancel_dir
    return srv


def stream(server, model: str, doc: dict) -> list[dict]:
    with httpx.Client(timeout=WAIT_S) as client:
        resp = client.post(f"{server.http_base}/v2/models/{model}/generate_stream", json=doc)
    assert resp.status_code == 200, resp.text
    return [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]


def texts(events: list[dict]) -> list[str]:
    return [e["text_output"] for e in events if "text_output" in e]


def test_trtllm_reply_by_prompt(server):
    say = stream(server, "llm_trtllm", {"text_input": "x SAY: Hello, world! :END y", "max_tokens": 50,
                                        "stream": True})
    assert texts(say) == [" Hello,", " world! "]
    count = stream(server, "llm_trtllm", {"text_input": "COUNT:5", "max_tokens": 3, "stream": True})
    assert texts(count) == ["1", " 2", " 3"]
    echo = stream(server, "llm_trtllm", {"text_input": "a b  c", "max_tokens": 9, "stop_words": ["c"]})
    assert texts(echo) == ["a b  "]  # not streamed: one response, stopped before the stop word
    fail = stream(server, "llm_trtllm", {"text_input": "SAY:a b:END FAIL:boom:END", "max_tokens": 9,
                                         "stream": True})
    assert texts(fail) == ["a", " b"] and fail[-1] == {"error": "boom"}


def test_trtllm_sees_the_inputs_it_was_given(server):
    (event,) = stream(server, "llm_trtllm", {"text_input": "INPUTS?", "max_tokens": 999, "temperature": 0.5,
                                             "stop_words": ["x", "y"], "seed": 7, "stream": False})
    assert json.loads(event["text_output"]) == {"max_tokens": 999, "temperature": 0.5, "stop_words": ["x", "y"],
                                                "seed": 7, "stream": False}


def test_counts(server):
    events = stream(server, "llm_trtllm_counts", {"text_input": "one two SAY:a b c:END", "stream": True})
    assert texts(events) == ["a", " b", " c"]
    assert {e["num_input_tokens"] for e in events} == {5} and [e["num_output_tokens"] for e in events] == [1, 1, 1]


def test_vllm_convention(server):
    params = json.dumps({"max_tokens": 2, "temperature": 0})
    events = stream(server, "llm_vllm", {"text_input": "p SAY:a b c:END", "stream": True,
                                         "sampling_parameters": params, "exclude_input_in_output": True,
                                         "return_num_input_tokens": True, "return_num_output_tokens": True})
    assert texts(events) == ["a", " b"]
    assert events[0]["num_input_tokens"] == 4
    echoed = stream(server, "llm_vllm", {"text_input": "p SAY:a:END", "sampling_parameters": params})
    assert texts(echoed) == ["p SAY:a:ENDa"] and "num_input_tokens" not in echoed[0]  # the prompt put first
    (inputs,) = stream(server, "llm_vllm", {"text_input": "INPUTS?", "exclude_input_in_output": True,
                                            "sampling_parameters": json.dumps({"stop": ["zz"], "top_p": 0.9})})
    assert json.loads(inputs["text_output"]) == {"exclude_input_in_output": True,
                                                 "sampling_parameters": {"stop": ["zz"], "top_p": 0.9}}


def test_token_cadence_and_cancellation(server, harness):
    url = f"{server.http_base}/v2/models/llm_slow/generate_stream"
    stamps = []
    with httpx.Client(timeout=WAIT_S) as client:
        start = time.monotonic()
        with client.stream("POST", url, json={"text_input": "COUNT:4", "max_tokens": 9, "stream": True}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    stamps.append(time.monotonic() - start)
        assert len(stamps) == 4 and stamps[-1] >= 4 * 0.025 * 0.99  # one token every 25 ms, never sooner
        with client.stream("POST", url, json={"text_input": "COUNT:100000", "max_tokens": 100000,
                                              "stream": True}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    break  # the first token: close the connection, which cancels the request
    marker = harness.wait_for(lambda: list(server.cancel_dir.glob("cancelled_*")), WAIT_S, "the cancel marker")
    assert marker[0].read_text() == "COUNT:100000"
