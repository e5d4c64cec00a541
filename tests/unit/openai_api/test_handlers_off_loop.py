"""The OpenAI handlers keep the event loop free: token counts by the tokenizer and chat templates run on a
thread (encoding a long prompt, rendering a long conversation take milliseconds to seconds; only a short
conversation whose template is compiled already renders on the loop, faster than the hop), and an
embeddings list runs a bounded number of requests at once, cancelling the rest when one fails.

The handlers run over a small in-process data plane (the parts they call: model_config, model_ready,
repository_index, stream_infer); the OpenAI API's end-to-end tests (tests/e2e/openai) run the real server.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any

import orjson
import pytest
from inferd.supervisor.config import OpenAIOptions
from inferd.supervisor.core.model_handle import GivenModel
from inferd.supervisor.http_api.request_cycle import Request
from inferd.supervisor.inference.types import InferResponse, Tensor
from inferd.supervisor.openai_api import embeddings
from inferd.supervisor.openai_api.catalog import Catalog
from inferd.supervisor.openai_api.chat import INLINE_RENDER_BYTES, INLINE_RENDER_ITEMS, Chat
from inferd.supervisor.openai_api.completions import Completions
from inferd.supervisor.openai_api.context import Api
from inferd.worker.wire.errors import ErrorCode, InferdError

TOKENIZER = "/nonexistent/tokenizer"  # never loaded: the catalog's cache holds the stand-in below
LLM = {"name": "llm", "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
       "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}]}
EMBED = {"name": "embed", "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
         "output": [{"name": "vector", "data_type": "TYPE_FP32", "dims": [2]}]}


def _text(value: str) -> Tensor:
    data = value.encode()
    return Tensor("text_output", "BYTES", [1], struct.pack("<I", len(data)) + data)


class Plane:
    """The data plane as the OpenAI handlers see it: an LLM echoing its prompt, an embedding model that
    waits on `gate` (and fails on the text "fail")."""

    def __init__(self) -> None:
        self.configs = {"llm": LLM, "embed": EMBED}
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0
        self.gate = asyncio.Event()

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        if name not in self.configs:
            raise InferdError(ErrorCode.NOT_FOUND, f"no model {name}")
        return self.configs[name]

    def model(self, name: str, version: str = "") -> GivenModel:
        return GivenModel(name, version, False, dict, lambda: self.model_config(name, version))

    def model_ready(self, name: str, version: str = "") -> bool:
        return name in self.configs

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [{"name": n, "version": "1", "state": "READY"} for n in self.configs]

    async def stream_infer(self, request: Any) -> Any:
        text = bytes(request.inputs[0].data[4:]).decode()
        if request.model_name == "llm":
            yield InferResponse("llm", "1", outputs=[_text(text)])
            return
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if text == "fail":
                raise InferdError(ErrorCode.INVALID_ARG, "the model refuses 'fail'")
            await self.gate.wait()
            yield InferResponse("embed", "1", outputs=[Tensor("vector", "FP32", [2], struct.pack("<2f", 1, 2))])
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


class LoopBoundTokenizer:
    """count() asks the event loop to run a callback and waits for it: on the loop thread itself it never
    runs (the wait then times out)."""

    def __init__(self, compiled: bool = True) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.compiled = compiled  # what template_compiled() answers
        self.counted_off_loop: list[bool] = []
        self.rendered_off_loop: list[bool] = []

    def _off_loop(self) -> bool:
        if threading.get_ident() == self.loop_thread:
            return False
        loop_ran = threading.Event()
        self.loop.call_soon_threadsafe(loop_ran.set)
        return loop_ran.wait(2.0)

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        self.counted_off_loop.append(self._off_loop())
        return len(text.split())

    def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> str:
        self.rendered_off_loop.append(self._off_loop())
        return " ".join(str(m["content"]) for m in messages)

    def template_compiled(self, with_tools: bool = False, template: str | None = None) -> bool:
        return self.compiled


def _api(plane: Plane, tokenizer: Any) -> Api:
    catalog = Catalog(plane, (), tokenizer=TOKENIZER)  # type: ignore[arg-type]
    catalog._tokenizers[TOKENIZER] = tokenizer
    return Api(plane, catalog, OpenAIOptions())  # type: ignore[arg-type]


def _post(path: str, body: dict[str, Any]) -> Request:
    return Request("POST", path, "", {"content-type": "application/json"}, orjson.dumps(body), True)


@pytest.mark.parametrize(("path", "handler", "body"), [
    ("/v1/completions", Completions, {"model": "llm", "prompt": "a long prompt"}),
    ("/v1/chat/completions", Chat, {"model": "llm", "messages": [{"role": "user", "content": "a long prompt"}]}),
])
async def test_usage_is_counted_off_the_event_loop(path, handler, body):
    tokenizer = LoopBoundTokenizer()
    resp = await handler(_api(Plane(), tokenizer))(_post(path, body))
    assert resp.status == 200
    assert orjson.loads(resp.body)["usage"]["prompt_tokens"] == 3
    assert tokenizer.counted_off_loop and all(tokenizer.counted_off_loop)


async def test_the_chat_template_renders_off_the_event_loop():
    tokenizer = LoopBoundTokenizer()
    body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}] * (INLINE_RENDER_ITEMS + 1)}
    resp = await Chat(_api(Plane(), tokenizer))(_post("/v1/chat/completions", body))
    assert resp.status == 200 and tokenizer.rendered_off_loop == [True]


@pytest.mark.parametrize(("messages", "content", "compiled", "off_loop"), [
    (3, "hi", True, False),  # short, template compiled: rendered on the loop (no hop to a thread and back)
    (3, "hi", False, True),  # the template's first use compiles it: on a thread
    (1, "x" * INLINE_RENDER_BYTES, True, True),  # a long body
    (INLINE_RENDER_ITEMS, "hi", True, False),
])
async def test_only_a_short_conversation_renders_on_the_loop(messages, content, compiled, off_loop):
    tokenizer = LoopBoundTokenizer(compiled)
    body = {"model": "llm", "messages": [{"role": "user", "content": content}] * messages}
    resp = await Chat(_api(Plane(), tokenizer))(_post("/v1/chat/completions", body))
    assert resp.status == 200 and tokenizer.rendered_off_loop == [off_loop]


async def test_embedding_usage_is_counted_off_the_event_loop():
    tokenizer = LoopBoundTokenizer()
    plane = Plane()
    plane.gate.set()
    resp = await embeddings.Embeddings(_api(plane, tokenizer))(
        _post("/v1/embeddings", {"model": "embed", "input": ["one two", "three"]}))
    assert orjson.loads(resp.body)["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert tokenizer.counted_off_loop and all(tokenizer.counted_off_loop)


async def test_an_embeddings_list_runs_a_bounded_number_of_requests_at_once():
    plane = Plane()
    tokenizer = LoopBoundTokenizer()
    items = [f"text {i}" for i in range(embeddings.MAX_IN_FLIGHT * 4)]
    task = asyncio.ensure_future(embeddings.Embeddings(_api(plane, tokenizer))(
        _post("/v1/embeddings", {"model": "embed", "input": items})))
    while plane.in_flight < embeddings.MAX_IN_FLIGHT and not task.done():
        await asyncio.sleep(0)
    for _ in range(10):  # more turns of the loop start nothing more
        await asyncio.sleep(0)
    assert plane.in_flight == embeddings.MAX_IN_FLIGHT
    plane.gate.set()
    resp = await task
    assert len(orjson.loads(resp.body)["data"]) == len(items)
    assert plane.most_in_flight == embeddings.MAX_IN_FLIGHT


async def test_a_failed_embedding_cancels_the_others():
    plane = Plane()
    handler = embeddings.Embeddings(_api(plane, None))
    with pytest.raises(InferdError, match="refuses"):
        await handler(_post("/v1/embeddings", {"model": "embed", "input": ["a", "b", "fail", "c"]}))
    assert plane.in_flight == 0 and plane.cancelled == 3
