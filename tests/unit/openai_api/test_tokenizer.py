"""supervisor/openai_api/tokenizer.py: local tokenizers only, chat templates rendered as transformers renders
them (checked against transformers itself where it is installed), clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

import openai_support  # noqa: E402  (tests/ is on sys.path through the root conftest)
from inferd.supervisor.openai_api.tokenizer import (  # noqa: E402
    ChatTemplateError,
    TokenizerError,
    load_tokenizer,
)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> & here",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [
    {"role": "system", "content": "Be brief; ünïcode & <tags> stay as they are."},
    {"role": "user", "content": "What is the weather in Dallas?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abcDEF123", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Dallas"}'}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "98"},
    {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "tomorrow?"}]},
]

# a template using what Hugging Face templates use: loop controls, namespace, tojson's options, is string,
# the {% generation %} block, raise_exception, indented blocks trimmed (trim_blocks, lstrip_blocks)
KITCHEN_SINK = """{{ bos_token }}
{%- set ns = namespace(n=0) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- continue %}
    {%- endif %}
    {%- set ns.n = ns.n + 1 %}
    {%- if loop.index > 40 %}{% break %}{% endif %}
[{{ ns.n }}:{{ message.role | upper }}]
    {%- if message.content is string %} {{ message.content | trim }}
    {%- elif message.tool_calls %} {{ message.tool_calls | map(attribute='function') | list | tojson(indent=2) }}
    {%- endif %}
    {%- if message.role == 'assistant' %}{% generation %}{{ eos_token }}{% endgeneration %}{% endif %}
{% endfor %}
{%- if tools %}tools={{ tools | tojson(separators=(',', ':'), sort_keys=true) }}{% endif %}
{%- if messages | length > 99 %}{{ raise_exception('too many') }}{% endif %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}"""


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    return openai_support.build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def test_encode_decode_count(tok_dir):
    tok = load_tokenizer(str(tok_dir))
    text = "Hello, wörld! 日本 <|eot_id|>"
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert "<|eot_id|>" not in tok.decode(ids)
    assert tok.count(text) == len(ids)
    bos = tok.encode("<|begin_of_text|>")
    assert len(bos) == 1
    assert tok.encode("hi", add_special_tokens=True) == bos + tok.encode("hi")
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|eot_id|>"


def _ticks_while_encoding(tok, text: str) -> float:
    """Wake-ups per second of this thread (sleeping 1 ms at a time, each wake-up needing the GIL) while
    another thread encodes `text` 10 times."""
    import threading
    import time

    done = threading.Event()
    worker = threading.Thread(target=lambda: ([tok.encode(text) for _ in range(10)], done.set()))
    ticks, t0 = 0, time.perf_counter()
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        ticks += 1
    worker.join()
    return ticks / (time.perf_counter() - t0)


def test_long_texts_encode_without_holding_the_gil(tok_dir, monkeypatch):
    from inferd.supervisor.openai_api import tokenizer as tk

    tok = load_tokenizer(str(tok_dir))
    text = "Hello, wörld! <|eot_id|> the quick brown fox. " * 800
    assert len(text) > tk.GIL_FREE_CHARS
    assert tok.encode(text) == tok._backend.encode(text, add_special_tokens=False).ids
    assert tok.count(text, add_special_tokens=True) == len(tok._backend.encode(text).ids)
    free = _ticks_while_encoding(tok, text)
    monkeypatch.setattr(tk, "GIL_FREE_CHARS", 10 * len(text))  # the plain encode() for every length
    held = _ticks_while_encoding(tok, text)
    assert free > 2 * held, (free, held)


def test_tokenizer_json_file_path(tok_dir):
    tok = load_tokenizer(str(tok_dir / "tokenizer.json"))
    assert tok.encode("hello") == load_tokenizer(str(tok_dir)).encode("hello")
    assert tok.chat_template == openai_support.LLAMA3_TEMPLATE  # tokenizer_config.json beside it


@pytest.mark.parametrize("path", ["meta-llama/Llama-3.1-8B-Instruct", "/no/such/dir", "relative/missing"])
def test_never_downloads(path):
    with pytest.raises(TokenizerError, match="never downloads") as info:
        load_tokenizer(path)
    assert path in str(info.value)


def test_empty_path():
    with pytest.raises(TokenizerError, match="no tokenizer path"):
        load_tokenizer("")


def test_unreadable_files(tmp_path, tok_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot read tokenizer .*tokenizer.json"):
        load_tokenizer(str(bad))
    cfg = tmp_path / "badcfg"
    shutil.copytree(tok_dir, cfg)
    (cfg / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizerError, match="tokenizer_config.json .* not a JSON object"):
        load_tokenizer(str(cfg))
    other = tmp_path / "model.bin"
    other.write_bytes(b"\0")
    with pytest.raises(TokenizerError, match="not a tokenizer.json"):
        load_tokenizer(str(other))


def test_folder_without_tokenizer_json(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                "chat_template": "{{ messages[0].content }}"}))
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(TokenizerError, match="no tokenizer.json.*pip install transformers"):
            load_tokenizer(str(tmp_path))
        return
    tok = load_tokenizer(str(tmp_path))
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi"


def test_chat_template_llama3(tok_dir):
    tok = load_tokenizer(str(tok_dir))
    prompt = tok.apply_chat_template(MESSAGES[:2])
    assert prompt == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + MESSAGES[0]["content"]
                      + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is the weather in Dallas?"
                      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert not tok.apply_chat_template(MESSAGES[:2], add_generation_prompt=False).endswith("\n\n")
    with_tools = tok.apply_chat_template(MESSAGES, tools=TOOLS)
    assert json.dumps(TOOLS[0], ensure_ascii=False) in with_tools  # tojson leaves <, > and & alone
    # the assistant's call written back with its arguments as an object, not a quoted string
    assert '{"name": "get_weather", "parameters": {"city": "Dallas"}}' in with_tools
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n98<|eot_id|>" in with_tools
    assert "And tomorrow?<|eot_id|>" in with_tools
    assert MESSAGES[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Dallas"}'  # caller's copy kept


def test_template_override_and_missing(tmp_path):
    plain = openai_support.build_tokenizer(tmp_path / "plain", chat_template=None)
    tok = load_tokenizer(str(plain))
    with pytest.raises(TokenizerError, match="no chat template.*--chat-template"):
        tok.apply_chat_template(MESSAGES[:2])
    assert tok.apply_chat_template(MESSAGES[1:2], template="{{ messages[0].content }}!") == \
        "What is the weather in Dallas?!"


def test_named_templates_and_template_files(tmp_path):
    named = openai_support.build_tokenizer(tmp_path / "named", chat_template=[
        {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools={{ tools | length }}"}])
    tok = load_tokenizer(str(named))
    assert tok.apply_chat_template(MESSAGES[:2]) == "plain"
    assert tok.apply_chat_template(MESSAGES[:2], tools=TOOLS) == "tools=1"
    jinja = openai_support.build_tokenizer(tmp_path / "jinja", chat_template=None)
    (jinja / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert load_tokenizer(str(jinja)).apply_chat_template(MESSAGES) == "J5"
    js = openai_support.build_tokenizer(tmp_path / "js", chat_template=None)
    (js / "chat_template.json").write_text(json.dumps({"chat_template": "S{{ add_generation_prompt }}"}))
    assert load_tokenizer(str(js)).apply_chat_template(MESSAGES, add_generation_prompt=False) == "SFalse"
    bad = openai_support.build_tokenizer(tmp_path / "bad", chat_template=None, extra_config={"chat_template": 3})
    with pytest.raises(TokenizerError, match="chat_template must be"):
        load_tokenizer(str(bad))


def test_added_token_objects_in_config(tmp_path):
    d = openai_support.build_tokenizer(tmp_path / "t", extra_config={
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False}, "eos_token": "</s>"})
    tok = load_tokenizer(str(d))
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert tok.apply_chat_template(MESSAGES[:1], template="{{ bos_token }}|{{ eos_token }}") == "<s>|</s>"


def test_template_helpers(tok_dir):
    tok = load_tokenizer(str(tok_dir))
    with pytest.raises(ChatTemplateError, match="refused the messages: roles must alternate"):
        tok.apply_chat_template(MESSAGES, template="{{ raise_exception('roles must alternate') }}")
    year = tok.apply_chat_template(MESSAGES, template="{{ strftime_now('%Y') }}")
    assert year.isdigit() and len(year) == 4
    assert tok.apply_chat_template(MESSAGES, template="{{ x }}-{{ y }}", x=1, y="two") == "1-two"
    with pytest.raises(TokenizerError, match="does not compile"):
        tok.apply_chat_template(MESSAGES, template="{% if %}")
    with pytest.raises(ChatTemplateError, match="failed"):
        tok.apply_chat_template(MESSAGES, template="{{ 1 // 0 }}")


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__ }}",
    "{{ ''.__class__.__subclasses__() }}",
    "{% set _ = messages.append({'role': 'x'}) %}",
    "{{ bos_token.format_map({}) }}{{ cycler.__init__.__globals__ }}",
])
def test_sandbox(tok_dir, template):
    with pytest.raises(ChatTemplateError):
        load_tokenizer(str(tok_dir)).apply_chat_template(MESSAGES, template=template)


@pytest.mark.parametrize("template", ["LLAMA3_TEMPLATE", "MISTRAL_TEMPLATE", "KITCHEN_SINK"])
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_same_prompt_as_transformers(tok_dir, template, tools, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    source = KITCHEN_SINK if template == "KITCHEN_SINK" else getattr(openai_support, template)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    messages = [m for m in MESSAGES if template != "MISTRAL_TEMPLATE" or isinstance(m.get("content"), str | None)]
    ours = load_tokenizer(str(tok_dir)).apply_chat_template(messages, tools=tools, template=source,
                                                            add_generation_prompt=add_generation_prompt)
    # transformers wants a tool call's arguments as an object; we accept the JSON string clients send back
    as_objects = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]
    expected = theirs.apply_chat_template(as_objects, tools=tools, chat_template=source, tokenize=False,
                                          add_generation_prompt=add_generation_prompt)
    assert ours == expected
