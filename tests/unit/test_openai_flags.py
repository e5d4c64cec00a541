"""--openai-* flags read into config.OpenAIOptions (flags.py), Triton's OpenAI frontend spellings and messages."""

from __future__ import annotations

import pytest
from inferd.supervisor.flags import parse_args, parse_openai_restrictions


def test_defaults_off(tmp_path):
    options = parse_args(["--model-repository", str(tmp_path)]).openai
    assert options.port == 0 and options.default_max_tokens == 16 and options.restricted == {}


def test_all_flags(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    options = parse_args(["--model-repository", str(tmp_path), "--openai-port", "9000", "--tokenizer", str(tmp_path),
                          "--openai-backend", "vllm", "--lora-separator", "_lora_", "--tool-call-parser", "mistral",
                          "--chat-template", str(template), "--default-max-tokens", "7",
                          "--openai-restricted-api", "inference,embedding", "k", "v",
                          "--openai-restricted-api", "health k2 v2"]).openai
    assert (options.port, options.backend, options.lora_separator, options.tool_call_parser) == \
        (9000, "vllm", "_lora_", "mistral")
    assert options.tokenizer == str(tmp_path) and options.chat_template == str(template)
    assert options.default_max_tokens == 7
    assert options.restricted == {"inference": ("k", "v"), "embedding": ("k", "v"), "health": ("k2", "v2")}


@pytest.mark.parametrize("values, message", [
    ([["nope", "k", "v"]], "Unknown API 'nope'"),
    ([["inference,inference", "k", "v"]], "restricted api 'inference' can not be specified in multiple config groups"),
    ([["inference k v"], ["inference", "k", "v"]], "can not be specified in multiple config groups"),
    ([["inference", "k"]], "expected '<apis> <header> <value>'"),
])
def test_bad_restrictions(values, message):
    with pytest.raises(ValueError, match=message):
        parse_openai_restrictions(values)


@pytest.mark.parametrize("args, message", [
    (["--tokenizer", "meta-llama/Meta-Llama-3.1-8B-Instruct"], "local files only"),
    (["--chat-template", "/no/such/file"], "--chat-template /no/such/file: no such file"),
    (["--default-max-tokens", "-1"], "--default-max-tokens must not be negative"),
    (["--openai-port", "70000"], "--openai-port must be between 0 and 65535"),
])
def test_refused_at_start(tmp_path, args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-repository", str(tmp_path), *args])
    assert message in str(exc.value)
