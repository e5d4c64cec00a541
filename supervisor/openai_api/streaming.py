"""Running one generation on the data plane, for both endpoints: the model's responses as they come
(`Stream`), token counts and finish reason (`Tally`), all of them gathered for a plain answer (`collect`),
and the server-sent events' framing.

Streams use http_api's machinery: the handler's coroutine waits for the first response (so that a
refusal before it keeps its HTTP status), then answers a `StreamingResponse` whose chunks the connection
writes as they come. The connection stops pulling chunks while the client does not read (its transport
paused), so responses wait in the request's bounded ResponseStream (core/streaming.py: 4096 at most, then
the request ends); a client that goes away cancels the task, whose `finally` closes the data plane's
iterator, which cancels the request in the model (is_cancelled()).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from inferd.supervisor.core.dataplane import DataPlane
from inferd.supervisor.inference.types import InferRequest, InferResponse
from inferd.worker.wire.errors import InferdError

from . import errors, outputs

FINAL = "triton_final_response"
DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_error(exc: BaseException) -> bytes:
    """An error met after the stream began: OpenAI's error object as one event (the stream then ends)."""
    return sse(errors.from_exception(exc).body())


class Tally:
    """Token counts from the model's `num_input_tokens` / `num_output_tokens` outputs (the output count
    summed over a stream's responses, as Triton's frontend sums them)."""

    __slots__ = ("prompt", "completion", "max_tokens")

    def __init__(self, max_tokens: int) -> None:
        self.prompt: int | None = None
        self.completion: int | None = None
        self.max_tokens = max_tokens

    def add(self, resp: InferResponse) -> None:
        if len(resp.outputs) < 2:  # text_output alone (or nothing): no counts to read
            return
        if self.prompt is None:
            self.prompt = outputs.count(resp, "num_input_tokens")
        n = outputs.count(resp, "num_output_tokens")
        if n is not None:
            self.completion = (self.completion or 0) + n

    def finish_reason(self) -> str:
        """"length" when the model is known to have made max_tokens tokens, else "stop"."""
        if self.max_tokens and self.completion is not None and self.completion >= self.max_tokens:
            return "length"
        return "stop"

    def usage(self, tokenizer: Any, prompt: str, text: str) -> dict[str, int] | None:
        """OpenAI's usage object: the model's counts, else the tokenizer's; None when neither is known."""
        prompt_tokens, completion_tokens = self.prompt, self.completion
        if tokenizer is not None:
            if prompt_tokens is None:
                prompt_tokens = tokenizer.count(prompt)
            if completion_tokens is None:
                completion_tokens = tokenizer.count(text)
        if prompt_tokens is None or completion_tokens is None:
            return None
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}


def is_data(resp: InferResponse) -> bool:
    """A response with outputs, or one that is not a flag-only final."""
    return bool(resp.outputs) or not resp.parameters.get(FINAL, False)


class Stream:
    """The responses of one request: `first()` before the HTTP answer begins, then iteration."""

    def __init__(self, dp: DataPlane, request: InferRequest) -> None:
        self.responses: Any = dp.stream_infer(request)

    async def first(self) -> InferResponse | None:
        """The first response (None: the model answered nothing); a failure before it is raised."""
        try:
            return await self.next()
        except BaseException:
            await self.close()
            raise

    async def next(self) -> InferResponse | None:
        """The next response; None at the end. An error response raises InferdError."""
        try:
            item = await self.responses.__anext__()
        except StopAsyncIteration:
            return None
        if isinstance(item, InferdError):
            raise item
        return item  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Ends the request if it has not ended (the model sees is_cancelled())."""
        await self.responses.aclose()


async def collect(stream: Stream, tally: Tally, want_logprobs: bool) -> tuple[str, list[Any]]:
    """Every response of a plain (not streamed) answer: the text joined, the logprob entries."""
    parts: list[bytes] = []
    logprobs: list[Any] = []
    try:
        resp = await stream.first()
        while resp is not None:
            tally.add(resp)
            parts.append(outputs.text_bytes(resp))
            if want_logprobs:
                entries = outputs.json_output(resp, "logprobs")
                if entries:
                    logprobs.extend(entries)
            resp = await stream.next()
    finally:
        await stream.close()
    return b"".join(parts).decode("utf-8", "replace"), logprobs


async def chunks_then_done(events: AsyncIterator[bytes], stream: Stream) -> AsyncIterator[bytes]:
    """`events`, then `data: [DONE]`; an error on the way becomes an error event; the request always
    ends (closing the generator, as a departed client does, cancels it)."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        yield sse_error(exc)
    finally:
        await stream.close()
    yield DONE
