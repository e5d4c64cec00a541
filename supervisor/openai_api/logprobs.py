"""vLLM's `logprobs` output (a JSON list, one entry per generated token: {token_id: {"logprob", "rank",
"decoded_token"}}) in OpenAI's two shapes: chat (`{"content": [{token, logprob, bytes, top_logprobs}]}`)
and completions (`{tokens, token_logprobs, text_offset, top_logprobs}`). The chosen token is the one of
the lowest rank, as vLLM ranks the sampled token first."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any


def _ranked(entries: list[Any]) -> Iterator[list[tuple[str, float]]]:
    """Each position's (token, logprob) candidates, the lowest rank first; entries that are not objects, or
    hold no candidate, are skipped."""
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        items = sorted((v for v in entry.values() if isinstance(v, dict)), key=_rank)
        if items:
            yield [(str(v.get("decoded_token", "")), float(v.get("logprob", 0.0))) for v in items]


def _rank(v: dict[str, Any]) -> int:
    r = v.get("rank")
    return r if isinstance(r, int) else sys.maxsize


def chat(entries: list[Any]) -> dict[str, Any] | None:
    content = []
    for ranked in _ranked(entries):
        token, logprob = ranked[0]
        content.append({
            "token": token, "logprob": logprob, "bytes": list(token.encode()),
            "top_logprobs": [{"token": t, "logprob": p, "bytes": list(t.encode())} for t, p in ranked],
        })
    return {"content": content} if content else None


def completion(entries: list[Any], offset: int = 0) -> dict[str, Any] | None:
    """`offset`: where this piece of text starts in the whole completion (streamed chunks)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    text_offset: list[int] = []
    top: list[dict[str, float]] = []
    for ranked in _ranked(entries):
        token, logprob = ranked[0]
        tokens.append(token)
        token_logprobs.append(logprob)
        text_offset.append(offset)
        top.append(dict(ranked))
        offset += len(token)
    if not tokens:
        return None
    return {"tokens": tokens, "token_logprobs": token_logprobs, "text_offset": text_offset, "top_logprobs": top}
