"""Writes tokenizer/ beside this file: the tiny_llm example's tokenizer (a byte-level BPE trained here on a
few paragraphs, so any text encodes) and its tokenizer_config.json with the chat template.

The files are committed; run this again only to change them (needs `pip install tokenizers`):

    python examples/tiny_llm/make_tokenizer.py

The OpenAI frontend reads them (the model's config parameter `tokenizer`): the template turns a chat into
the prompt that model.py reads, and the tokenizer counts `usage`. Nothing is downloaded.
"""

import json
from pathlib import Path

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|python_tag|>"]

# Llama-3-like: a header per message, tools listed as JSON lines in a system block, tool calls written back
# as {"name": ..., "parameters": ...}, tool results under the role "ipython".
CHAT_TEMPLATE = """{{- bos_token }}
{%- if tools %}
<|start_header_id|>system<|end_header_id|>

Tools you can call, one JSON object per line. To call one, answer with {"name": ..., "parameters": {...}} only.
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|eot_id|>
{%- endif %}
{%- for message in messages %}
<|start_header_id|>{{ 'ipython' if message.role == 'tool' else message.role }}<|end_header_id|>

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

CORPUS = """tiny_llm is an example language model for inferd. It has no weights: it answers by repeating what it
is told, word by word, so that the OpenAI API can be tried without downloading anything. You said this.
Backwards it reads the other way. The tool answered with a result. What is the weather in Paris, London,
Tokyo or New York today? It is sunny and warm, 21 degrees. Hello! How are you? I am fine, thank you.
The quick brown fox jumps over the lazy dog. Tell me a story about a model server, a client and a stream
of tokens. {"name": "get_weather", "parameters": {"city": "Paris"}} system user assistant ipython tool
function arguments parameters type object string number properties required description content role
0 1 2 3 4 5 6 7 8 9 10 100 1000 a an and are as at be by for from has in is it of on or that the to was with
"""


def main(out: Path = Path(__file__).resolve().parent / "tokenizer") -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS], trainer=trainers.BpeTrainer(
        vocab_size=800, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": bos, "eos_token": "<|eot_id|>", "model_max_length": 8192,
              "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
