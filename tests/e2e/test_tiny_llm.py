"""examples/tiny_llm through the OpenAI API as `make run` serves it (--openai-port, --tool-call-parser
llama3): the README's `openai` snippet runs, and the example answers chat, streams, calls tools, completes,
stops; its committed tokenizer is the one make_tokenizer.py makes."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_llm"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"type": "integer"}, "city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def server(module_server_factory, harness):
    (port,) = harness.free_ports(1)
    srv = module_server_factory(["tiny_llm"], extra_args=["--openai-port", str(port), "--openai-address",
                                                          "127.0.0.1", "--tool-call-parser", "llama3"])
    srv.openai_base = f"http://127.0.0.1:{port}"
    return srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.openai_base + "/v1", api_key="unused", max_retries=0, timeout=30)


def chat(client, content, **kw):
    return client.chat.completions.create(model="tiny_llm", messages=[{"role": "user", "content": content}], **kw)


def test_readme_snippet(server):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## OpenAI API"):]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    code = code.replace("http://localhost:9000", server.openai_base)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        'You said "Hello there". Backwards: there Hello.',
        'You said "Stream this". Backwards: this Stream.',
        "Function(arguments='{\"city\": \"Paris\"}', name='get_weather')",
    ]


def test_chat_streamed_matches_plain_and_counts_usage(client):
    plain = chat(client, "Tell me a story")
    assert plain.choices[0].message.content == 'You said "Tell me a story". Backwards: story a me Tell.'
    assert plain.choices[0].finish_reason == "stop"
    pieces, usage = [], None
    for chunk in chat(client, "Tell me a story", stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) == plain.choices[0].message.content and len(pieces) == 11  # one word per chunk
    assert usage.model_dump() == plain.usage.model_dump() and usage.completion_tokens > 0


def test_tools_and_tool_results(client):
    reply = chat(client, "Is it raining in New York today?", tools=TOOLS)
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "York"}')
    messages = [{"role": "user", "content": "Is it raining in New York today?"},
                {"role": "assistant", "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "no, 21 degrees"}]
    answer = client.chat.completions.create(model="tiny_llm", messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content == "The tool answered: no, 21 degrees."


def test_completion_max_tokens_and_stop(client):
    done = client.completions.create(model="tiny_llm", prompt="one two three four", max_tokens=3)
    assert done.choices[0].text == " four three two"
    stopped = chat(client, "alpha beta gamma", stop=["Backwards"])
    assert stopped.choices[0].message.content == 'You said "alpha beta gamma".'


def test_committed_tokenizer_is_what_the_script_makes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_tokenizer", EXAMPLE / "make_tokenizer.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(tmp_path)
    from inferd.supervisor.openai_api.tokenizer import load_tokenizer

    made, committed = load_tokenizer(str(tmp_path)), load_tokenizer(str(EXAMPLE / "tokenizer"))
    assert committed.chat_template == made.chat_template == script.CHAT_TEMPLATE
    sample = script.CORPUS + " 日本語 <|eot_id|> zebra"
    assert committed.encode(sample) == made.encode(sample)
