"""POST /v1/chat/completions: the messages rendered by the model's chat template (its tokenizer's, or
--chat-template), generated as a completion, answered whole or streamed as chat.completion.chunk events
(the role first, then content or tool-call deltas, the finish reason last, a usage chunk with
`stream_options.include_usage`, then `data: [DONE]`). Tool calls: chat_request.py and G2's tool_calls.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from inferd.supervisor.http_api.generate import StreamingResponse
from inferd.supervisor.http_api.request_cycle import Response

from . import chat_request, outputs, schema
from . import logprobs as lp
from .catalog import ModelInfo
from .context import Api
from .conventions import Generation, generate_request
from .errors import bad_request, server_error
from .streaming import Stream, Tally, chunks_then_done, collect, sse

ROLE = "assistant"
# A short conversation is rendered on the event loop when its template is compiled already: a few short
# messages render in tens of µs (~9 µs a message, ~70 µs for an 8 KB one), less than the hop to a thread
# and back (~0.2 ms of time to first token on a 2-vCPU host). Anything larger goes to a thread.
INLINE_RENDER_BYTES = 8192  # the request body, bytes
INLINE_RENDER_ITEMS = 8  # messages, and tools


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Chat:
    def __init__(self, api: Api) -> None:
        self.api = api
        self._parser: Any = None

    def parser(self) -> Any:
        """G2's tool-call parser for --tool-call-parser (one per server; streams get their own streamer)."""
        if self._parser is None:
            from .tool_calls import get_parser

            self._parser = get_parser(self.api.options.tool_call_parser)
        return self._parser

    async def __call__(self, req: Any) -> Response:
        body = schema.check(schema.load(req.body), schema.CHAT)
        info, handle, lora, task = self.api.catalog.resolve(body["model"], self.api.options.lora_separator)
        tokenizer = await self.api.catalog.tokenizer(info)
        if tokenizer is None:
            raise server_error(f"Unknown tokenizer: model '{info.name}' has none to apply its chat template; start "
                               "the server with --tokenizer DIR, or give the model a config parameter "
                               "'tokenizer' (a local directory)")
        parser_name = self.api.options.tool_call_parser
        chat_request.check(body, info, parser_name)
        mode = chat_request.tool_mode(body, parser_name)
        guide, optional = chat_request.guide(body, info, mode)
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        messages = chat_request.conversation(body["messages"])
        if (len(req.body) <= INLINE_RENDER_BYTES and len(messages) <= INLINE_RENDER_ITEMS
                and len(tools or ()) <= INLINE_RENDER_ITEMS
                and tokenizer.template_compiled(bool(tools), self.api.chat_template)):
            prompt = self._render(tokenizer, messages, tools)
        else:  # on a thread: a template renders a long conversation for seconds (100,000 messages: ~1 s)
            prompt = await asyncio.to_thread(self._render, tokenizer, messages, tools)
        limit = body.get("max_completion_tokens")
        if limit is None:
            limit = body.get("max_tokens")
        top = body.get("top_logprobs")
        gen = Generation(prompt=prompt, body=body, stream=bool(body.get("stream")),
                         max_tokens=self.api.options.default_max_tokens if limit is None else limit,
                         logprobs=(top or 1) if body.get("logprobs") else 0, guide=guide, guide_optional=optional,
                         lora=lora, lora_task=task)
        request = generate_request(info.name, "", info.inputs, gen, handle)
        stream = Stream(self.api.dp, request)
        if gen.stream:
            first = await stream.first()
            return StreamingResponse(chunks_then_done(self._events(first, body, info, gen, mode, stream), stream))
        return await self._plain(body, info, gen, mode, stream)

    def _render(self, tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> str:
        from .tokenizer import ChatTemplateError, TokenizerError

        try:
            return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,  # type: ignore[no-any-return]
                                                 template=self.api.chat_template)
        except ChatTemplateError as exc:  # the template refused these messages (raise_exception, roles...)
            raise bad_request(f"the chat template cannot render these messages: {exc}", param="messages") from None
        except TokenizerError as exc:  # no template, or one that does not compile: the server's setup
            raise server_error(str(exc)) from None

    # ---- a whole answer ----
    async def _plain(self, body: dict[str, Any], info: ModelInfo, gen: Generation, mode: chat_request.ToolMode,
                     stream: Stream) -> Response:
        tally = Tally(gen.max_tokens)
        text, entries = await collect(stream, tally, gen.logprobs > 0)
        finish = tally.finish_reason()
        message: dict[str, Any] = {"role": ROLE, "content": text}
        if mode.forced is not None:
            message = {"role": ROLE, "content": None, "tool_calls": [
                {"id": _call_id(), "type": "function", "function": {"name": mode.forced, "arguments": text}}]}
        elif mode.auto:
            content, calls = self.parser().parse(text)
            message = {"role": ROLE, "content": content}
            if calls:
                message["tool_calls"] = calls
                finish = "tool_calls"
        answer = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                  "model": body["model"], "system_fingerprint": None,
                  "choices": [{"index": 0, "message": message, "logprobs": lp.chat(entries) if entries else None,
                               "finish_reason": finish}],
                  "usage": await self.api.catalog.usage(info, tally, gen.prompt, text)}
        return Response(200, orjson.dumps(answer))

    # ---- a stream ----
    async def _events(self, resp: Any, body: dict[str, Any], info: ModelInfo, gen: Generation,
                      mode: chat_request.ToolMode, stream: Stream) -> AsyncIterator[bytes]:
        """The stream's events; those one response makes leave as one chunk (the role's event with the first
        response's: one write instead of two, the second of which would wait for the loop's next pass)."""
        ident = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        dumps = orjson.dumps
        head = b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,' \
               b'"delta":' % (ident.encode(), created, dumps(body["model"]))
        tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        out = [head + b'{"role":"assistant","content":""}' + tail]  # the events of this response
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        tally = Tally(gen.max_tokens)
        decode = outputs.TextDecoder()
        text_bytes = outputs.text_bytes
        kept: list[str] = []
        streamer = self.parser().streamer() if mode.auto else None
        called = False  # a tool call was streamed (auto): the finish reason is "tool_calls"
        fed = 0
        call_id: str | None = None
        while resp is not None:
            tally.add(resp)
            final = bool(resp.parameters.get("triton_final_response", True))
            text = decode(text_bytes(resp), final)
            if usage:
                kept.append(text)
            logprobs = b"null"
            if gen.logprobs:
                entries = outputs.json_output(resp, "logprobs")
                logprobs = dumps(lp.chat(entries) if entries else None)
            if streamer is not None:
                fed += len(text.encode())
                if fed > self.api.options.max_tool_call_parse_bytes:
                    await stream.close()  # the model stops; the client learns the text was cut
                    out.append(head + b'{"content":""},"logprobs":null,"finish_reason":"length"}]}\n\n')
                    break
                deltas = streamer.feed(text) if text else []
                if final:
                    deltas += streamer.finish()
                for i, delta in enumerate(deltas):
                    called = called or bool(delta.get("tool_calls"))
                    last = final and i == len(deltas) - 1
                    out.append(head + dumps(delta) + self._tail(logprobs, "tool_calls" if called else
                                                                tally.finish_reason(), last))
                if final and not deltas:
                    out.append(head + b'{"content":""}' + self._tail(logprobs, "tool_calls" if called else
                                                                     tally.finish_reason(), True))
            elif mode.forced is not None:
                if text or final:
                    call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
                    if call_id is None:
                        call_id = _call_id()
                        call = {"index": 0, "id": call_id, "type": "function",
                                "function": {"name": mode.forced, "arguments": text}}
                    out.append(head + dumps({"tool_calls": [call]}) + self._tail(logprobs, tally.finish_reason(),
                                                                                 final))
            elif final:
                out.append(head + b'{"content":' + dumps(text) + b'}' + self._tail(logprobs, tally.finish_reason(),
                                                                                   True))
            elif text:
                out.append(head + b'{"content":' + dumps(text) + b'},"logprobs":' + logprobs +
                           b',"finish_reason":null}]}\n\n')
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
                out.clear()
            resp = await stream.next()
        if out:
            yield b"".join(out)
        if usage:
            counts = await self.api.catalog.usage(info, tally, gen.prompt, "".join(kept))
            if counts is not None:
                yield sse({"id": ident, "object": "chat.completion.chunk", "created": created,
                           "model": body["model"], "choices": [], "usage": counts})

    @staticmethod
    def _tail(logprobs: bytes, finish: str, final: bool) -> bytes:
        reason = b'"%s"' % finish.encode() if final else b"null"
        return b',"logprobs":' + logprobs + b',"finish_reason":' + reason + b'}]}\n\n'
