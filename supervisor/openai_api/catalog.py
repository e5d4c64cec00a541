"""What the OpenAI API knows of each model: its inputs and convention (conventions.ModelInputs), when the
API first saw its loaded version (`created`), its tokenizer and its LoRA adapters. Read from the data
plane's config of the ready version and kept until that version changes (a reload brings a new config).

Tokenizers come from local files only (G2's tokenizer.py never downloads): a model's config parameter
`tokenizer` (a path, relative to the model's directory or absolute), else --tokenizer. Each path is loaded
once, in a worker thread, and shared.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from inferd.supervisor.core.dataplane import InProcessDataPlane
from inferd.supervisor.core.model_handle import ModelHandle
from inferd.worker.wire.errors import ErrorCode, InferdError

from . import errors
from .conventions import ModelInputs

log = logging.getLogger("inferd.openai")

TOKENIZER_PARAMETER = "tokenizer"


@dataclass
class ModelInfo:
    name: str
    config: dict[str, Any]
    inputs: ModelInputs
    created: int
    tokenizer_path: str
    loras: list[str] = field(default_factory=list)  # adapter names, in multi_lora.json's order


class Resolved(NamedTuple):
    """A request's model: its info, its handle (for the InferRequest), the LoRA adapter named (or None) and
    that adapter's 1-based task id (0 without one)."""

    info: ModelInfo
    handle: ModelHandle
    lora: str | None
    task: int


class Catalog:
    def __init__(self, dataplane: InProcessDataPlane, repositories: tuple[str, ...], *, tokenizer: str = "",
                 backend: str = "") -> None:
        self.dp = dataplane
        self.repositories = repositories
        self.default_tokenizer = tokenizer
        self.backend = backend
        self._models: dict[str, ModelInfo] = {}
        self._tokenizers: dict[str, Any] = {}  # path -> Tokenizer, or the TokenizerError met loading it
        self._loading: dict[str, asyncio.Future[Any]] = {}

    def get(self, name: str) -> ModelInfo:
        """The ready model `name`; 404 when no version of it is loaded."""
        return self.lookup(name)[0]

    def lookup(self, name: str) -> tuple[ModelInfo, ModelHandle]:
        """The ready model `name` and its handle, resolved once for a request (DataPlane.model: the request
        carries it to the data plane, which then does not look the name up again); 404 as `get`."""
        try:
            handle = self.dp.model(name)
            config = handle.config()
        except InferdError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                raise errors.unknown_model(name) from None
            raise
        info = self._models.get(name)
        if info is not None and info.config is config:
            return info, handle
        if not self.dp.model_ready(name):
            raise errors.unknown_model(name)
        info = ModelInfo(name, config, ModelInputs.of(config, self.backend), int(time.time()),
                         self._tokenizer_path(name, config), self._loras(name, config))
        if len(self._models) > 4096:
            self._models.clear()
        self._models[name] = info
        return info, handle

    def resolve(self, requested: str, separator: str) -> Resolved:
        """The model a request names, and its LoRA adapter when the name is `model<separator>lora` (Triton's
        --lora-separator; a name that splits into more than two parts is a model name)."""
        if separator and separator in requested:
            parts = requested.split(separator)
            if len(parts) == 2:
                info, handle = self.lookup(parts[0])
                if parts[1] not in info.loras:
                    raise errors.bad_request(f"Unknown LoRA: {parts[1]}; for model: {requested}", param="model")
                return Resolved(info, handle, parts[1], info.loras.index(parts[1]) + 1)
        info, handle = self.lookup(requested)
        return Resolved(info, handle, None, 0)

    def ready_names(self) -> list[str]:
        return sorted({row["name"] for row in self.dp.repository_index(ready_only=True)})

    def forget(self, name: str) -> None:
        self._models.pop(name, None)

    # ---- tokenizers ----
    def _model_dirs(self, name: str) -> list[str]:
        return [os.path.join(repo, name) for repo in self.repositories if "://" not in repo]

    def _tokenizer_path(self, name: str, config: dict[str, Any]) -> str:
        param = (config.get("parameters") or {}).get(TOKENIZER_PARAMETER)
        value = param.get("string_value") if isinstance(param, dict) else param
        if not value:
            return self.default_tokenizer
        value = str(value)
        if os.path.isabs(value):
            return value
        for base in self._model_dirs(name):
            candidate = os.path.join(base, value)
            if os.path.exists(candidate):
                return candidate
        return value  # loading names it as given (and fails: nothing is downloaded)

    async def tokenizer(self, info: ModelInfo) -> Any:
        """The model's tokenizer (G2's tokenizer.Tokenizer), None without one; 500 when it cannot load."""
        path = info.tokenizer_path
        if not path:
            return None
        found = self._tokenizers.get(path)
        if found is None:
            pending = self._loading.get(path)
            if pending is None:
                pending = asyncio.ensure_future(asyncio.to_thread(_load, path))
                self._loading[path] = pending
            try:
                found = await asyncio.shield(pending)
            finally:
                self._loading.pop(path, None)
            self._tokenizers[path] = found
        if isinstance(found, Exception):
            raise errors.server_error(f"the tokenizer of model '{info.name}' cannot be loaded: {found}")
        return found

    async def usage(self, info: ModelInfo, tally: Any, prompt: str, text: str) -> dict[str, int] | None:
        """OpenAI's usage object (streaming.Tally.usage): the model's counts, else the tokenizer's, counted on
        a thread: encoding a long prompt takes milliseconds to seconds (it lets the GIL go, tokenizer.py),
        which on the event loop would stall every other connection."""
        if tally.prompt is not None and tally.completion is not None:
            return tally.usage(None, prompt, text)  # type: ignore[no-any-return]
        tokenizer = await self.tokenizer(info)
        if tokenizer is None:
            return tally.usage(None, prompt, text)  # type: ignore[no-any-return]
        return await asyncio.to_thread(tally.usage, tokenizer, prompt, text)  # type: ignore[no-any-return]

    async def count(self, info: ModelInfo, texts: list[str]) -> int | None:
        """Tokens in `texts` by the model's tokenizer (on a thread, as `usage`); None without a tokenizer."""
        tokenizer = await self.tokenizer(info)
        if tokenizer is None:
            return None
        return await asyncio.to_thread(lambda: sum(tokenizer.count(t) for t in texts))

    # ---- LoRA adapters ----
    def _loras(self, name: str, config: dict[str, Any]) -> list[str]:
        """Adapters listed in <model>/<version>/multi_lora.json (Triton's layout), in file order."""
        version = self._version(name)
        for base in self._model_dirs(name):
            path = os.path.join(base, version, "multi_lora.json")
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                log.warning("model '%s': %s is not readable JSON: %s", name, path, exc)
                return []
            if isinstance(doc, dict):
                return [str(k) for k in doc]
        return []

    def _version(self, name: str) -> str:
        rows = [r for r in self.dp.repository_index(ready_only=True) if r.get("name") == name and r.get("version")]
        return max((r["version"] for r in rows), key=int, default="1")


def _load(path: str) -> Any:
    from .tokenizer import TokenizerError, load_tokenizer

    try:
        return load_tokenizer(path)
    except TokenizerError as exc:
        return exc
