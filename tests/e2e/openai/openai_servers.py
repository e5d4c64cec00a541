"""Servers for the OpenAI API tests (each test module starts the one it needs once, module scope, from
conftest's module_server_factory): real inferd processes with --openai-port, language-model fixtures
(tests/fixtures/models/llm_*, see tests/openai_support.py) and tokenizers built by the tests.

- `main`: TensorRT-LLM style models (llm_trtllm, llm_trtllm_counts with token counts, llm_slow: one token
  every 20 ms, leaving a file in its cancel dir when cancelled), embedding models (text_embed, vllm_embed),
  a non-LLM model (identity), --tool-call-parser llama3.
- `vllm`: the vLLM convention (--openai-backend vllm) on llm_vllm, --tool-call-parser mistral.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai_support
import pytest

openai = pytest.importorskip("openai")


@dataclass
class OpenAIServer:
    server: Any  # conftest.Server
    port: int
    cancel_dir: Path | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def v1(self) -> str:
        return self.base + "/v1"

    def client(self, **kw: Any) -> Any:
        return openai.OpenAI(base_url=self.v1, api_key="EMPTY", max_retries=0, timeout=30.0, **kw)

    def async_client(self, **kw: Any) -> Any:
        return openai.AsyncOpenAI(base_url=self.v1, api_key="EMPTY", max_retries=0, timeout=30.0, **kw)


def start(factory: Any, harness: Any, models: dict[str, str], *, extra: list[str] = (),  # type: ignore[assignment]
          params: dict[str, dict[str, str]] | None = None, tokenizer_for: tuple[str, ...] = (),
          chat_template: str = openai_support.LLAMA3_TEMPLATE, **kw: Any) -> OpenAIServer:
    repo = factory.make_repo(models)
    for name in tokenizer_for:
        path = openai_support.build_tokenizer(repo / name / "tokenizer", chat_template=chat_template)
        openai_support.set_parameters(repo / name, {"tokenizer": str(path)})
    for name, values in (params or {}).items():
        openai_support.set_parameters(repo / name, values)
    (port,) = harness.free_ports(1)
    server = factory(models=list(models), repo=repo,
                     extra_args=["--openai-port", str(port), "--openai-address", "127.0.0.1", *extra], **kw)
    return OpenAIServer(server, port)


def main(factory: Any, harness: Any, cancel_dir: Path | None = None, extra: list[str] = ()) -> OpenAIServer:  # type: ignore[assignment]
    """The main test server (see the module doc)."""
    models = {"llm_trtllm": "llm_trtllm", "llm_trtllm_counts": "llm_trtllm_counts", "llm_slow": "llm_trtllm",
              "text_embed": "text_embed", "vllm_embed": "vllm_embed", "identity": "identity"}
    params = {"llm_slow": {"token_delay_ms": "20"}}
    if cancel_dir is not None:  # a cancelled request leaves a file there holding its prompt
        params["llm_slow"]["cancel_dir"] = str(cancel_dir)
        params["llm_trtllm"] = {"cancel_dir": str(cancel_dir)}
    srv = start(factory, harness, models, extra=["--tool-call-parser", "llama3", *extra],
                tokenizer_for=("llm_trtllm", "llm_trtllm_counts", "llm_slow", "text_embed"), params=params)
    srv.cancel_dir = cancel_dir
    return srv


def vllm(factory: Any, harness: Any) -> OpenAIServer:
    """llm_vllm served with the vLLM convention (--openai-backend vllm) and the mistral tool-call parser."""
    return start(factory, harness, {"llm_vllm": "llm_vllm", "vllm_embed": "vllm_embed"},
                 extra=["--openai-backend", "vllm", "--tool-call-parser", "mistral"], tokenizer_for=("llm_vllm",),
                 chat_template=openai_support.MISTRAL_TEMPLATE)
