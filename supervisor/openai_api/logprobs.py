"""vLLM's `logprobs` output (a JSON list, one entry per generated token: {token_id: {"logprob", "rank",
"decoded_token"}}) in OpenAI's two shapes: chat (`{"content": [{token, logprob, bytes, top_logprobs}]}`)
and completions (`{tokens, token_logprobs, text_offset, top_logprobs}`). The chosen token is the one of
the lowest rank, as vLLM ranks the sampled token first."""

from __future__ import annotations

import sys
from typing import Any


def _ranked(entry: dict[str, Any]) -> list[dict[str, Any]]:
    items = [v for v in entry.values() if isinstance(v, dict)]

    def rank(v: dict[str, Any]) -> int:
        r = v.get("rank")
        return r if isinstance(r, int) else sys.maxsize

    return sorted(items, key=rank)


def chat(entries: list[Any]) -> dict[str, Any] | None:
    content = []
    for entry in entries:
        if not isinstance(entry, dict) or not entry:
            continue
        ranked = _ranked(entry)
        if not ranked:
            continue
        chosen = ranked[0]
        token = str(chosen.get("decoded_token", ""))
        content.append({
            "token": token, "logprob": float(chosen.get("logprob", 0.0)), "bytes": list(token.encode()),
            "top_logprobs": [{"token": str(v.get("decoded_token", "")), "logprob": float(v.get("logprob", 0.0)),
                              "bytes": list(str(v.get("decoded_token", "")).encode())} for v in ranked],
        })
    return {"content": content} if content else None


def completion(entries: list[Any], offset: int = 0) -> dict[str, Any] | None:
    """`offset`: where this piece of text starts in the whole completion (streamed chunks)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    text_offset: list[int] = []
    top: list[dict[str, float]] = []
    for entry in entries:
        if not isinstance(entry, dict) or not entry:
            continue
        ranked = _ranked(entry)
        if not ranked:
            continue
        token = str(ranked[0].get("decoded_token", ""))
        tokens.append(token)
        token_logprobs.append(float(ranked[0].get("logprob", 0.0)))
        text_offset.append(offset)
        top.append({str(v.get("decoded_token", "")): float(v.get("logprob", 0.0)) for v in ranked})
        offset += len(token)
    if not tokens:
        return None
    return {"tokens": tokens, "token_logprobs": token_logprobs, "text_offset": text_offset, "top_logprobs": top}
