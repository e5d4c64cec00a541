"""Helpers for the OpenAI frontend's tests and benches: tokenizers made on the spot, language-model fixtures.

Import it as `import openai_support` (tests/ is on sys.path through the root conftest).

Tokenizers (need the `tokenizers` package, the [openai] extra):
- `build_tokenizer(dest, *, chat_template=LLAMA3_TEMPLATE, vocab_size=600, corpus=CORPUS) -> Path`: trains a
  small byte-level BPE tokenizer in-process (a fraction of a second, deterministic) and writes `dest/`
  with tokenizer.json and tokenizer_config.json (bos `<|begin_of_text|>`, eos `<|eot_id|>`, the template).
  Byte-level: any text encodes and decodes back unchanged. `chat_template=None` writes no template;
  a list of {"name", "template"} writes named templates.
- `LLAMA3_TEMPLATE`: a Llama-3-like chat template with tools (a system block listing them as JSON, the
  assistant's tool calls written back as {"name": ..., "parameters": ...}, tool results as role ipython).
  `MISTRAL_TEMPLATE`: a Mistral-like one ([AVAILABLE_TOOLS], [INST], [TOOL_CALLS], [TOOL_RESULTS]).
- `SPECIAL_TOKENS`: the special tokens those templates use (each one id in the tokenizer).

Language-model fixtures (tests/fixtures/models; their model.py docstring is the full reference):
- `llm_trtllm`: TensorRT-LLM-style inputs (text_input, max_tokens required, stream, stop_words, temperature,
  top_p, top_k, penalties, seed, guided_decoding_*), output text_output only, max_batch_size 64.
- `llm_trtllm_counts`: the same with num_input_tokens / num_output_tokens outputs, max_batch_size 0.
- `llm_vllm`: vLLM-backend inputs (text_input, stream, sampling_parameters JSON, exclude_input_in_output,
  return_num_input_tokens, ...) and outputs (text_output, num_input_tokens, num_output_tokens); it is a
  Python model, so the frontend must be told the vLLM convention for it.
  The reply comes from the prompt: `SAY:<text>:END` -> <text>; `COUNT:<n>` -> "1 2 ... n"; `INPUTS?` -> the
  inputs it received as JSON; otherwise an echo of the prompt; `FAIL:<msg>:END` adds an error response.
  One word (with its leading space) per streamed response.
- `set_parameters(model_dir, {key: value})`: add or replace string parameters in a copied model's
  config.pbtxt: `tokenizer` (the per-model tokenizer), `token_delay_ms` (one token every N ms),
  `token_chars` (N-character tokens), `stamp_tokens` ("1": each token is "<arrived>:<sent>", the request's
  arrival in execute() and the token's send time, time.monotonic_ns()),
  `cancel_dir` (a cancelled request leaves a file cancelled_* there).
- `llm_repo(server_factory, models, tokenizer=True) -> Path`: a repository of those fixtures (names or
  {name: fixture}) with a tokenizer built into each model directory (parameter `tokenizer`, the absolute
  path of `<model dir>/tokenizer`), ready for `server_factory(repo=..., models=...)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|python_tag|>", "<|eom_id|>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                  "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]

LLM_FIXTURES = ("llm_trtllm", "llm_trtllm_counts", "llm_vllm")

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if tools %}
<|start_header_id|>system<|end_header_id|>

You can call these functions. To call one, answer only with JSON: {"name": function name, "parameters": arguments}.
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|eot_id|>
{%- endif %}
{%- for message in messages %}
{%- set role = 'ipython' if message.role == 'tool' else message.role %}
<|start_header_id|>{{ role }}<|end_header_id|>

{% if message.tool_calls %}
{%- for call in message.tool_calls %}
{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}
{%- endfor %}
{%- elif message.content is string %}
{{- message.content }}
{%- elif message.content %}
{%- for part in message.content if part.type == 'text' %}{{ part.text }}{% endfor %}
{%- endif %}
<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL_TEMPLATE = """{{- bos_token }}
{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or message.role == 'system' %}[INST]{{ message.content }}[/INST]
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{"call_id": {{ message.tool_call_id | tojson }}, \
"content": {{ message.content | tojson }}}[/TOOL_RESULTS]
{%- elif message.tool_calls %}[TOOL_CALLS][
{%- for call in message.tool_calls %}{"name": {{ call.function.name | tojson }}, \
"arguments": {{ call.function.arguments | tojson }}, "id": {{ call.id | tojson }}}{{ ', ' if not loop.last }}
{%- endfor %}]{{ eos_token }}
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- else %}{{ raise_exception('unknown role: ' + message.role) }}
{%- endif %}
{%- endfor %}"""

CORPUS = """The quick brown fox jumps over the lazy dog. A tokenizer splits text into tokens; a language model
reads the tokens of its prompt and writes new ones, one at a time. What is the weather in Dallas, Texas in
Fahrenheit? It is 98 degrees and sunny. {"name": "get_current_weather", "parameters": {"city": "Dallas",
"state": "TX", "unit": "fahrenheit"}} The user asked a question and the assistant answered it. Hello, world!
system user assistant tool ipython function arguments parameters call result content role messages
0 1 2 3 4 5 6 7 8 9 10 100 1000 Triton inferd server model repository inference request response stream
"""


def build_tokenizer(dest: Path | str, *, chat_template: str | list[dict[str, str]] | None = LLAMA3_TEMPLATE,
                    vocab_size: int = 600, corpus: str = CORPUS,
                    extra_config: dict[str, Any] | None = None) -> Path:
    """Train a small byte-level BPE tokenizer on `corpus` and write it to `dest` (see the module doc)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer=trainer)
    bos = SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(dest / "tokenizer.json"))
    config: dict[str, Any] = {"bos_token": bos, "eos_token": "<|eot_id|>", "model_max_length": 4096,
                              "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    config.update(extra_config or {})
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


def set_parameters(model_dir: Path | str, params: dict[str, str]) -> None:
    """Add or replace `parameters { key: ... value: { string_value: ... } }` entries in model_dir's
    config.pbtxt (appended at the end; an entry with the same key is removed first)."""
    config = Path(model_dir) / "config.pbtxt"
    text = config.read_text()
    for key, value in params.items():
        entry = re.compile(r'parameters\s*\{\s*key:\s*"%s"\s*value:\s*\{\s*string_value:\s*"(?:[^"\\]|\\.)*"\s*\}\s*\}'
                           % re.escape(key))
        text = entry.sub("", text)
        text += 'parameters { key: "%s" value: { string_value: %s } }\n' % (key, json.dumps(str(value)))
    config.write_text(text)


def llm_repo(server_factory: Any, models: Iterable[str] | dict[str, str] = ("llm_trtllm",), *,
             tokenizer: bool = True, chat_template: str | None = LLAMA3_TEMPLATE,
             params: dict[str, str] | None = None) -> Path:
    """A repository of LLM fixtures (names, or {name: fixture}), each with its own tokenizer when asked."""
    repo = server_factory.make_repo(models)
    names = list(models.keys()) if isinstance(models, dict) else list(models)
    for name in names:
        model_dir = repo / name
        extra = dict(params or {})
        if tokenizer:
            extra["tokenizer"] = str(build_tokenizer(model_dir / "tokenizer", chat_template=chat_template))
        if extra:
            set_parameters(model_dir, extra)
    return repo
