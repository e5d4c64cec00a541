"""Tool calls in a model's text: the llama3 and mistral formats, from a whole answer or streamed.

`get_parser("llama3" | "mistral")` returns a `ToolCallParser`:
- `parse(text) -> (content, tool_calls)`: OpenAI `message.tool_calls` entries ({"id", "type": "function",
  "function": {"name", "arguments": JSON string}}) and the text around them (None when the calls are all
  there is). Text holding no well-formed call comes back unchanged as content, calls [].
- `streamer()` -> `ToolCallStream`: `feed(delta_text)` and, at the end, `finish()` return chat-completion
  chunk `delta` dicts: {"content": str} or {"tool_calls": [{"index", "id", "type", "function": {"name",
  "arguments"}}]}. What a stream yields, joined, is what `parse` returns for the whole text (parse is the
  streamer run once), however the text is split.

Formats:
- llama3: JSON objects {"name": ..., "parameters" (or "arguments"): {...}}, after `<|python_tag|>` or as the
  answer itself (starting with `{`), several separated by `;` or whitespace; a list of them is read too.
- mistral: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"} (or one object), or the newer
  `[TOOL_CALLS]name[ARGS]{...}`; a bare list at the start is read too (engines that skip special tokens
  drop the `[TOOL_CALLS]` marker). Ids are 9 letters and digits, as Mistral's templates require.
Text before the marker is content; so is text after the last call (separators and end tokens dropped).

Streaming: content flows through as it comes, holding back only what may be the start of a marker; a
tool call goes out whole, once its JSON closes and reads as a call, so a malformed call is never half
sent: it, and everything after it, falls back to content (from the start when no call was read). A call
region that grows past `MAX_CALL_CHARS` without closing falls back the same way (bounded memory).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from collections.abc import Callable
from typing import Any

MAX_CALL_CHARS = 1 << 20
_SEPARATORS = " \t\r\n;"
_STRUCT = re.compile(r'[{}\[\]"]')
_IN_STRING = re.compile(r'["\\]')
_NAME = re.compile(r"[A-Za-z_][\w.\-]*\Z")
_NAME_HEAD = re.compile(r"[A-Za-z_][\w.\-]*")
_CALL_ID = re.compile(r"[A-Za-z0-9]*")
_ALNUM = string.ascii_letters + string.digits
_ARGS_TOKEN = "[ARGS]"
_CALL_ID_TOKEN = "[CALL_ID]"
_MAX_NAME_CHARS = 256

# stream states
_START, _CONTENT, _REGION, _VALUE, _NAMED, _PLAIN = range(6)


class _Format:
    def __init__(self, name: str, marker: str, end_tokens: tuple[str, ...], new_id: Callable[[], str],
                 named_calls: bool) -> None:
        self.name = name
        self.marker = marker  # the special token that opens the tool calls
        self.skip_tokens = (marker, *end_tokens)  # dropped between and after calls
        self.new_id = new_id
        self.named_calls = named_calls  # mistral's `name[ARGS]{...}`


def _llama_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _mistral_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


_FORMATS = {
    "llama3": _Format("llama3", "<|python_tag|>", ("<|eom_id|>", "<|eot_id|>"), _llama_id, False),
    "mistral": _Format("mistral", "[TOOL_CALLS]", ("</s>",), _mistral_id, True),
}


class ToolCallParser:
    """Stateless: one per format, shared by every request."""

    def __init__(self, fmt: _Format) -> None:
        self._fmt = fmt
        self.name = fmt.name

    def streamer(self) -> ToolCallStream:
        return ToolCallStream(self._fmt)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        stream = ToolCallStream(self._fmt)
        content: list[str] = []
        calls: list[dict] = []
        for delta in stream.feed(text) + stream.finish():
            if "content" in delta:
                content.append(delta["content"])
            else:
                for call in delta["tool_calls"]:
                    calls.append({"id": call["id"], "type": "function", "function": call["function"]})
        joined = "".join(content)
        return (joined or None) if calls else joined, calls


def get_parser(name: str) -> ToolCallParser:
    fmt = _FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown tool call parser {name!r}: choose one of {', '.join(sorted(_FORMATS))}")
    return ToolCallParser(fmt)


def _arguments(value: Any) -> str | None:
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):  # a model that wrote its arguments as a JSON string
        return value
    return None


def _call_of(obj: Any) -> tuple[str, str] | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    arguments = _arguments(obj.get("arguments", obj.get("parameters")))  # llama3 writes "parameters"
    if not isinstance(name, str) or not name or arguments is None:
        return None
    return name, arguments


def _calls_of(value: Any) -> list[tuple[str, str]] | None:
    """The calls a JSON value holds: one object, or a non-empty list of them; None when it is not that."""
    items = value if isinstance(value, list) else [value]
    calls = [_call_of(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


class _Scanner:
    """Where a JSON object or array ends, fed piece by piece: brackets counted outside strings (the value
    is checked by json.loads once it closes)."""

    __slots__ = ("depth", "in_string", "escape")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False

    def advance(self, text: str, i: int) -> tuple[int, int]:
        """(end, scanned): end is the index just past the closing bracket, or -1 with scanned = len(text)."""
        n = len(text)
        while i < n:
            if self.escape:
                self.escape = False
                i += 1
            elif self.in_string:
                m = _IN_STRING.search(text, i)
                if m is None:
                    return -1, n
                i = m.end()
                if m.group() == "\\":
                    self.escape = True
                else:
                    self.in_string = False
            else:
                m = _STRUCT.search(text, i)
                if m is None:
                    return -1, n
                i = m.end()
                c = m.group()
                if c == '"':
                    self.in_string = True
                elif c in "{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth <= 0:
                        return i, i
        return -1, n


class ToolCallStream:
    """One answer's parser state: feed() its text deltas in order, then finish() once."""

    def __init__(self, fmt: _Format) -> None:
        self._fmt = fmt
        self._state = _START
        self._buf = ""  # text held: undecided content, or the call region since the last good call
        self._pos = 0  # how far _buf is consumed (call region) or scanned (value)
        self._vstart = 0  # where the value being scanned starts in _buf
        self._item = 0  # where the call being read starts in _buf (its name or its value)
        self._scanner = _Scanner()
        self._checked = False  # the value's first character after its bracket was checked
        self._name: str | None = None  # mistral's name[ARGS]{...}: the name before the object
        self._parts: list[str] = []  # pieces of the value being scanned, not yet joined to _buf
        self._parts_len = 0
        self._closed_at = -1  # where in _buf the value closed, found while scanning pieces
        self._calls = 0  # calls sent
        self._said = False  # content sent

    # ------------------------------------------------------------------ public

    def feed(self, delta: str) -> list[dict]:
        state = self._state
        if state == _PLAIN or (state == _CONTENT and self._said and not self._buf
                               and self._fmt.marker[0] not in delta):  # plain text: passed on as it is
            return [{"content": delta}] if delta else []
        out: list[dict] = []
        if not delta:
            return out
        if self._state == _VALUE and self._checked:
            # a value arriving in many pieces: each piece is scanned once and kept in a list, joined when
            # the value closes (appending every piece to one string would copy it over and over)
            end, _ = self._scanner.advance(delta, 0)
            self._parts.append(delta)
            self._parts_len += len(delta)
            if end < 0:
                if len(self._buf) + self._parts_len > MAX_CALL_CHARS:
                    self._join_parts()
                    self._fall_back(out)
                return out
            self._closed_at = len(self._buf) + self._parts_len - len(delta) + end
            self._join_parts()
        else:
            self._buf += delta
        self._run(out)
        return _coalesce(out)

    def finish(self) -> list[dict]:
        out: list[dict] = []
        self._join_parts()
        state = self._state
        if state in (_START, _CONTENT):
            self._say(self._buf, out)
        elif state != _PLAIN:
            self._fall_back(out)
        self._state = _PLAIN
        self._buf = ""
        return _coalesce(out)

    # ------------------------------------------------------------------ states

    def _run(self, out: list[dict]) -> None:
        while True:
            state = self._state
            if state == _START:
                if not self._start():
                    return
            elif state == _CONTENT:
                if not self._content(out):
                    return
            elif state == _REGION:
                if not self._region(out):
                    return
            elif state == _NAMED:
                if not self._named(out):
                    return
            elif state == _VALUE:
                if not self._value(out):
                    return
            else:  # _PLAIN: what is left of _buf is content
                self._say(self._buf, out)
                self._buf = ""
                return

    def _start(self) -> bool:
        """Leading whitespace is held; the first other character decides: a bracket opens a bare call
        region, anything else is content (which still watches for the marker)."""
        buf = self._buf
        stripped = buf.lstrip()
        if not stripped:
            return False
        marker = self._fmt.marker
        if marker.startswith(stripped[:len(marker)]):
            if len(stripped) == 1 and stripped in "{[":
                return False  # "[" may open mistral's marker or a bare list
            self._state = _CONTENT
        elif stripped[0] in "{[":
            self._open_value(len(buf) - len(stripped))
        else:
            self._state = _CONTENT
        return True

    def _content(self, out: list[dict]) -> bool:
        buf, marker = self._buf, self._fmt.marker
        at = buf.find(marker)
        if at >= 0:
            before = buf[:at]
            if self._said or before.strip():
                self._say(before, out)
                self._buf = buf[at:]
            # else: only whitespace before the marker: it stays in the region (content if it falls back)
            self._pos = len(self._buf) - len(buf) + at + len(marker)
            self._state = _REGION
            return True
        keep = _marker_prefix_at_end(buf, marker)
        send = buf[:len(buf) - keep]
        if not self._said and not send.strip():
            return False  # whitespace so far: held until something else comes
        self._say(send, out)
        self._buf = buf[len(send):]
        return False

    def _region(self, out: list[dict]) -> bool:
        """Between calls: separators and end tokens are skipped; a bracket opens the next call; mistral's
        `name[ARGS]` names one; anything else ends the region (content, or a fall back before any call)."""
        buf, pos, n = self._buf, self._pos, len(self._buf)
        while pos < n:
            c = buf[pos]
            if c in _SEPARATORS:
                pos += 1
                continue
            token = _token_at(buf, pos, self._fmt.skip_tokens)
            if token is None:
                self._pos = pos
                return False  # the start of a token: wait for more
            if token:
                pos += len(token)
                continue
            self._pos = self._item = pos
            if c in "{[":
                self._open_value(pos)
                return True
            if self._fmt.named_calls and (c.isalpha() or c == "_"):
                self._state = _NAMED
                return True
            if self._calls:
                self._buf = buf[pos:]
                self._state = _PLAIN
            else:
                self._fall_back(out)
            return True
        self._pos = pos
        return False

    def _named(self, out: list[dict]) -> bool:
        buf, pos = self._buf, self._pos
        at = buf.find(_ARGS_TOKEN, pos)
        if at < 0:
            head = buf[pos:]
            if len(head) > _MAX_NAME_CHARS or not _could_be_named_head(head):
                self._fall_back(out)
                return True
            return False
        name = buf[pos:at]
        if _CALL_ID_TOKEN in name:
            name = name[:name.index(_CALL_ID_TOKEN)]
        if not _NAME.match(name):
            self._fall_back(out)
            return True
        rest = buf[at + len(_ARGS_TOKEN):]
        stripped = rest.lstrip()
        if not stripped:
            return False
        if stripped[0] != "{":
            self._fall_back(out)
            return True
        self._name = name
        self._open_value(len(buf) - len(stripped))
        return True

    def _open_value(self, at: int) -> None:
        self._vstart = at
        self._pos = at
        self._scanner = _Scanner()
        self._checked = False
        self._state = _VALUE

    def _value(self, out: list[dict]) -> bool:
        buf, start = self._buf, self._vstart
        if not self._checked:
            # what follows the bracket must be able to begin a call: `{"` or `[{` (a quick "no" for
            # ordinary text that happens to start with a bracket)
            inner = buf[start + 1:].lstrip()
            if not inner:
                return False
            if inner[0] not in ('"}' if buf[start] == "{" else "{]"):
                self._fall_back(out)
                return True
            self._checked = True
        if self._closed_at >= 0:
            end, self._closed_at = self._closed_at, -1
        else:
            end, self._pos = self._scanner.advance(buf, self._pos)
        if end < 0:
            if len(buf) > MAX_CALL_CHARS:
                self._fall_back(out)
                return True
            return False
        calls = self._read(buf[start:end])
        if calls is None:
            self._fall_back(out)
            return True
        for name, arguments in calls:
            out.append({"tool_calls": [{"index": self._calls, "id": self._fmt.new_id(), "type": "function",
                                        "function": {"name": name, "arguments": arguments}}]})
            self._calls += 1
        self._buf = buf[end:]
        self._pos = 0
        self._state = _REGION
        return True

    def _join_parts(self) -> None:
        if self._parts:
            self._buf += "".join(self._parts)
            self._parts = []
            self._parts_len = 0

    def _read(self, text: str) -> list[tuple[str, str]] | None:
        try:
            value = json.loads(text)
        except ValueError:
            return None
        name, self._name = self._name, None
        if name is not None:
            arguments = _arguments(value)
            return [(name, arguments)] if isinstance(value, dict) and arguments is not None else None
        return _calls_of(value)

    def _fall_back(self, out: list[dict]) -> None:
        """The region is not (or no longer) calls: its text is content; before any call, all of it, as
        it came; after one, from the call that failed (the separators and end tokens before it dropped)."""
        start = 0 if not self._calls else self._pos if self._state == _REGION else self._item
        text = self._buf[start:]
        self._say(text, out)
        self._buf = ""
        self._state = _PLAIN

    def _say(self, text: str, out: list[dict]) -> None:
        if text:
            out.append({"content": text})
            self._said = True


def _coalesce(out: list[dict]) -> list[dict]:
    if len(out) < 2:
        return out
    merged: list[dict] = []
    for delta in out:
        if merged and "content" in delta and "content" in merged[-1]:
            merged[-1] = {"content": merged[-1]["content"] + delta["content"]}
        else:
            merged.append(delta)
    return merged


def _marker_prefix_at_end(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker` (held back: it may grow into it)."""
    first = marker[0]
    i = text.find(first, max(0, len(text) - len(marker) + 1))
    while i >= 0:
        if marker.startswith(text[i:]):
            return len(text) - i
        i = text.find(first, i + 1)
    return 0


def _token_at(text: str, pos: int, tokens: tuple[str, ...]) -> str | None:
    """The token of `tokens` at text[pos:], "" when none starts there, None when text ends inside one."""
    rest = text[pos:pos + max(len(t) for t in tokens)]
    for token in tokens:
        if rest.startswith(token):
            return token
        if token.startswith(rest):
            return None
    return ""


def _could_be_named_head(head: str) -> bool:
    """Whether `head` can still grow into `name[ARGS]` or `name[CALL_ID]id[ARGS]`."""
    m = _NAME_HEAD.match(head)
    if m is None:
        return False
    tail = head[m.end():]
    if _ARGS_TOKEN.startswith(tail) or _CALL_ID_TOKEN.startswith(tail):
        return True
    if not tail.startswith(_CALL_ID_TOKEN):
        return False
    ident = _CALL_ID.match(tail, len(_CALL_ID_TOKEN))
    return ident is not None and _ARGS_TOKEN.startswith(tail[ident.end():])
