"""examples/templates/hf_transformers (issue 39 item 5): a Hugging Face transformers model served from the
Python-model template, its tokenizer and weights local files (a tiny random Llama made by the test with
save_pretrained, a tokenizer trained on the spot: nothing downloaded), streamed with a TextIteratorStreamer
through the OpenAI frontend's /v1/completions and /v2/.../generate_stream. Greedy text equals what
transformers' own generate() gives for the same prompt.

Slow (torch and transformers load in the worker); skipped where this environment lacks them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import vllm_support  # noqa: E402  (the tiny Llama)

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "templates" / "hf_transformers"
PROMPT = "Hello world"
TOKENS = 12

_REFERENCE = r'''
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
ids = tok(prompt, return_tensors="pt")
with torch.no_grad():
    out = model.generate(**ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
print(json.dumps(tok.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)))
'''


@pytest.fixture(scope="module")
def served(module_server_factory, harness) -> dict:
    repo = module_server_factory.make_repo([])
    folder = repo / "hf"
    shutil.copytree(TEMPLATE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "hf_transformers"', 'name: "hf"'))
    vllm_support.make_tiny_llama(sys.executable, folder / "hf_model")
    done = subprocess.run([sys.executable, "-c", _REFERENCE, str(folder / "hf_model"), PROMPT, str(TOKENS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (openai_port,) = harness.free_ports(1)
    server = module_server_factory(repo=repo, wait_ready=["hf"], start_timeout=300, extra_args=[
        "--openai-port", str(openai_port), "--openai-address", "127.0.0.1"])
    return {"server": server, "expected": json.loads(done.stdout), "openai": "http://127.0.0.1:%d/v1" % openai_port}


def _events(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line[6:].strip() != "[DONE]"]


def test_generate_stream_streams_the_greedy_text(served) -> None:
    status, raw = served["server"].post("/v2/models/hf/generate_stream", json.dumps(
        {"text_input": PROMPT, "max_tokens": TOKENS, "stream": True}).encode(), timeout=120)
    assert status == 200, raw[:500]
    pieces = [e["text_output"] for e in _events(raw) if e.get("text_output")]
    assert "".join(pieces) == served["expected"]
    assert len(pieces) > 1 or len(served["expected"].split()) <= 1  # streamed, not one answer


def test_openai_completions_whole_and_streamed(served) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served["openai"], api_key="EMPTY", max_retries=0, timeout=120.0)
    whole = client.completions.create(model="hf", prompt=PROMPT, temperature=0, max_tokens=TOKENS)
    assert whole.choices[0].text == served["expected"]
    chunks = client.completions.create(model="hf", prompt=PROMPT, temperature=0, max_tokens=TOKENS, stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == served["expected"]


def test_stop_word_ends_the_text_before_it(served) -> None:
    expected = served["expected"]
    if len(expected) < 4:
        pytest.skip("the random model's text is too short to hold a stop word")
    stop = expected[len(expected) // 2:len(expected) // 2 + 2]
    status, raw = served["server"].post("/v2/models/hf/generate", json.dumps(
        {"text_input": PROMPT, "max_tokens": TOKENS, "stop_words": [stop]}).encode(), timeout=120)
    assert status == 200, raw[:500]
    assert json.loads(raw)["text_output"] == expected[:expected.index(stop)]
