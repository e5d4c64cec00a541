"""POST /v1/completions: one prompt string to a model, answered whole or streamed (server-sent events,
`data: [DONE]` last, a usage chunk first with `stream_options.include_usage`).

Refused as Triton's frontend refuses them (400, its messages): suffix, an empty prompt, prompt lists, n or
best_of above 1 (best_of at all for vLLM models), logit_bias, logprobs for models that are not vLLM's,
stream_options without stream.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from inferd.supervisor.http_api.generate import StreamingResponse
from inferd.supervisor.http_api.request_cycle import Response

from . import logprobs as lp
from . import outputs, schema
from .catalog import ModelInfo
from .context import Api
from .conventions import VLLM, Generation, generate_request
from .errors import bad_request
from .streaming import Stream, Tally, chunks_then_done, collect, sse


def _check(body: dict[str, Any], info: ModelInfo) -> None:
    if body.get("suffix") is not None:
        raise bad_request("suffix is not currently supported", param="suffix")
    prompt = body["prompt"]
    if not prompt:
        raise bad_request("prompt must be non-empty", param="prompt")
    if not isinstance(prompt, str):
        raise bad_request("only single string input is supported", param="prompt")
    vllm = info.inputs.convention == VLLM
    if "best_of" in body and vllm:
        raise bad_request("best_of is no longer supported in vLLM backend, removed from vLLM V1 engine",
                          param="best_of")
    n = body.get("n")
    if n is not None and n > 1:
        raise bad_request(f"Received n={n}, but only single choice (n=1) is currently supported", param="n")
    best_of = body.get("best_of")
    if best_of is not None and best_of > 1:
        raise bad_request(f"Received best_of={best_of}, but only single choice (best_of=1) is currently supported",
                          param="best_of")
    if body.get("logit_bias") is not None:
        raise bad_request("logit bias is not supported", param="logit_bias")
    if (body.get("logprobs") or 0) > 0 and not vllm:
        raise bad_request("logprobs are currently available only for the vLLM backend", param="logprobs")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise bad_request("`stream_options` can only be used when `stream` is True", param="stream_options")


class Completions:
    def __init__(self, api: Api) -> None:
        self.api = api

    def __call__(self, req: Any) -> Any:
        body = schema.check(schema.load(req.body), schema.COMPLETION)
        info, handle, lora, task = self.api.catalog.resolve(body["model"], self.api.options.lora_separator)
        _check(body, info)
        max_tokens = body.get("max_tokens")
        gen = Generation(prompt=body["prompt"], body=body, stream=bool(body.get("stream")),
                         max_tokens=self.api.options.default_max_tokens if max_tokens is None else max_tokens,
                         echo=bool(body.get("echo")), logprobs=body.get("logprobs") or 0, lora=lora, lora_task=task)
        request = generate_request(info.name, "", info.inputs, gen, handle)
        if gen.stream:
            return self._stream(body, info, gen, Stream(self.api.dp, request))
        return self._plain(body, info, gen, Stream(self.api.dp, request))

    def _echo(self, info: ModelInfo, gen: Generation) -> str:
        """The prompt to put before the text ourselves: echo asked of a model without an echo input."""
        return gen.prompt if gen.echo and info.inputs.echo_input is None else ""

    async def _plain(self, body: dict[str, Any], info: ModelInfo, gen: Generation, stream: Stream) -> Response:
        tally = Tally(gen.max_tokens)
        text, entries = await collect(stream, tally, gen.logprobs > 0)
        choice = {"index": 0, "text": self._echo(info, gen) + text,
                  "logprobs": lp.completion(entries) if entries else None, "finish_reason": tally.finish_reason()}
        answer = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                  "model": body["model"], "choices": [choice], "system_fingerprint": None,
                  "usage": await self.api.catalog.usage(info, tally, gen.prompt, text)}
        return Response(200, orjson.dumps(answer))

    async def _stream(self, body: dict[str, Any], info: ModelInfo, gen: Generation, stream: Stream) -> Response:
        first = await stream.first()
        return StreamingResponse(chunks_then_done(self._events(first, body, info, gen, stream), stream))

    async def _events(self, resp: Any, body: dict[str, Any], info: ModelInfo, gen: Generation,
                      stream: Stream) -> AsyncIterator[bytes]:
        # every chunk is this prefix, the text as a JSON string, and one of the two tails
        ident = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        head = b'data: {"id":"%s","object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":' % (
            ident.encode(), created, orjson.dumps(body["model"]))
        tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        tally = Tally(gen.max_tokens)
        decode = outputs.TextDecoder()
        text_bytes = outputs.text_bytes
        dumps = orjson.dumps
        kept: list[str] = []  # the text, for token counts by the tokenizer
        offset = 0
        echo = self._echo(info, gen)
        if echo:
            yield head + dumps(echo) + tail
            offset = len(echo)
        while resp is not None:
            tally.add(resp)
            final = bool(resp.parameters.get("triton_final_response", True))
            text = decode(text_bytes(resp), final)
            if usage:
                kept.append(text)
            if gen.logprobs:
                entries = outputs.json_output(resp, "logprobs")
                logprobs = lp.completion(entries, offset) if entries else None
                offset += len(text)
                yield head + dumps(text) + b',"logprobs":' + dumps(logprobs) + (
                    b',"finish_reason":%s}]}\n\n' % dumps(tally.finish_reason() if final else None))
            elif final:
                yield head + dumps(text) + b',"logprobs":null,"finish_reason":"%s"}]}\n\n' % (
                    tally.finish_reason().encode())
            elif text:
                yield head + dumps(text) + tail
            resp = await stream.next()
        if usage:
            counts = await self.api.catalog.usage(info, tally, gen.prompt, "".join(kept))
            if counts is not None:
                yield sse({"id": ident, "object": "text_completion", "created": created, "model": body["model"],
                           "choices": [], "usage": counts})
