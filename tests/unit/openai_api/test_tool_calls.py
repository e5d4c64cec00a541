"""The llama3 and mistral tool-call parsers (supervisor/openai_api/tool_calls.py), whole and streamed.

Every case runs whole (parse) and streamed split at every character boundary, one character at a time
and in random pieces: the stream must yield what parse returns, and parse must give the expected answer.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from inferd.supervisor.openai_api import tool_calls as tc
from inferd.supervisor.openai_api.tool_calls import get_parser

CALL = '{"name": "get_weather", "parameters": {"city": "Dallas", "unit": "fahrenheit"}}'
ARGS = {"city": "Dallas", "unit": "fahrenheit"}

# (text, expected content, expected [(name, arguments as a dict or a str)])
LLAMA3 = [
    ("Hello world", "Hello world", []),
    ("", "", []),
    ("   \n", "   \n", []),
    (CALL, None, [("get_weather", ARGS)]),
    ('{"name": "f", "arguments": {"a": 1}}', None, [("f", {"a": 1})]),
    ("<|python_tag|>" + CALL, None, [("get_weather", ARGS)]),
    ("<|python_tag|> \n" + CALL, None, [("get_weather", ARGS)]),
    ("\n\n  " + CALL + "\n", None, [("get_weather", ARGS)]),
    (CALL + "; " + '{"name": "g", "parameters": {}}', None, [("get_weather", ARGS), ("g", {})]),
    (CALL + ";" + '{"name": "g", "parameters": {}}', None, [("get_weather", ARGS), ("g", {})]),
    (CALL + "\n" + '{"name": "g", "parameters": {}}', None, [("get_weather", ARGS), ("g", {})]),
    ("[" + CALL + ", " + '{"name": "g", "parameters": {}}]', None, [("get_weather", ARGS), ("g", {})]),
    ("Let me look. <|python_tag|>" + CALL, "Let me look. ", [("get_weather", ARGS)]),
    ("<|python_tag|>" + CALL + "<|eom_id|>", None, [("get_weather", ARGS)]),
    (CALL + "<|eot_id|>", None, [("get_weather", ARGS)]),
    (CALL + " Hope that helps.", "Hope that helps.", [("get_weather", ARGS)]),
    ('{"name": "f", "arguments": "{\\"a\\":1}"}', None, [("f", {"a": 1})]),  # a string, passed on as is
    ('{"name": "f", "parameters": {"q": "a}b{\\"c\\"]["}}', None, [("f", {"q": 'a}b{"c"]['})]),
    ('{"name": "f", "parameters": {"city": "Zürich 日本", "n": [1, [2, {"x": null}]]}}', None,
     [("f", {"city": "Zürich 日本", "n": [1, [2, {"x": None}]]})]),
    # not calls: content, unchanged
    ('{"name": "f", "parameters": {"a": 1}', '{"name": "f", "parameters": {"a": 1}', []),
    ('{"name": "f", "parameters": {"a": 1,}}', '{"name": "f", "parameters": {"a": 1,}}', []),
    ('{"answer": 42}', '{"answer": 42}', []),
    ('{"name": 3, "parameters": {}}', '{"name": 3, "parameters": {}}', []),
    ('{"name": "", "parameters": {}}', '{"name": "", "parameters": {}}', []),
    ('{"name": "f"}', '{"name": "f"}', []),
    ('{"name": "f", "parameters": [1]}', '{"name": "f", "parameters": [1]}', []),
    ("{curly} braces", "{curly} braces", []),
    ("[1] first, [2] second", "[1] first, [2] second", []),
    ("[]", "[]", []),
    ("<|python_tag|>print('hi')", "<|python_tag|>print('hi')", []),
    ("  <|python_tag|>{oops}", "  <|python_tag|>{oops}", []),
    ("a <| b", "a <| b", []),
    ("hello <|python", "hello <|python", []),
    ("<|python_tag|>", "<|python_tag|>", []),
    ("x {" + CALL[1:], "x {" + CALL[1:], []),  # a call after content without the tag is content
    # a malformed call after a good one: content from the bad one on
    (CALL + '; {"name": "g", "parameters": {', '{"name": "g", "parameters": {', [("get_weather", ARGS)]),
    (CALL + "; {bad}", "{bad}", [("get_weather", ARGS)]),
]

MISTRAL = [
    ("Hello world", "Hello world", []),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dallas", "unit": "fahrenheit"}}]', None,
     [("get_weather", ARGS)]),
    ('[TOOL_CALLS] [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": [1, 2]}}]', None,
     [("f", {}), ("g", {"b": [1, 2]})]),
    ('[TOOL_CALLS]{"name": "f", "arguments": {"a": "b"}}', None, [("f", {"a": "b"})]),
    ('Checking. [TOOL_CALLS][{"name": "f", "arguments": {}}]', "Checking. ", [("f", {})]),
    ('[{"name": "f", "arguments": {"x": 1}}]', None, [("f", {"x": 1})]),  # the marker skipped by the engine
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}]</s>', None, [("f", {})]),
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}][TOOL_CALLS][{"name": "g", "arguments": {}}]', None,
     [("f", {}), ("g", {})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Dallas", "unit": "fahrenheit"}', None, [("get_weather", ARGS)]),
    ('[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g.h-i[ARGS] {"b": 2}</s>', None, [("f", {"a": 1}), ("g.h-i", {"b": 2})]),
    ('[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{"a": 1}', None, [("f", {"a": 1})]),
    # not calls
    ("[1] first item", "[1] first item", []),
    ("[link](http://example.com)", "[link](http://example.com)", []),
    ("[", "[", []),
    ("[TOOL_CALLS", "[TOOL_CALLS", []),
    ("[TOOL_CALLS] sorry, no", "[TOOL_CALLS] sorry, no", []),
    ("[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}, 3]', '[TOOL_CALLS][{"name": "f", "arguments": {}}, 3]', []),
    ('[TOOL_CALLS][{"name": "f", "arguments": {}', '[TOOL_CALLS][{"name": "f", "arguments": {}', []),
    ("[TOOL_CALLS]1abc[ARGS]{}", "[TOOL_CALLS]1abc[ARGS]{}", []),
    ("[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]f[ARGS][1]", []),
    ("[TOOL_CALLS]f g[ARGS]{}", "[TOOL_CALLS]f g[ARGS]{}", []),
    ('[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{"b":', 'g[ARGS]{"b":', [("f", {"a": 1})]),
]

CASES = [("llama3", *c) for c in LLAMA3] + [("mistral", *c) for c in MISTRAL]


def _as_args(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _streamed(parser_name: str, pieces: list[str]) -> tuple[str | None, list[tuple[str, object]]]:
    """Run a stream over `pieces`, check each delta's shape, and join what it said."""
    stream = get_parser(parser_name).streamer()
    deltas = []
    for piece in pieces:
        deltas += stream.feed(piece)
    deltas += stream.finish()
    content, calls, ids = [], [], set()
    for delta in deltas:
        assert len(delta) == 1, delta
        if "content" in delta:
            assert isinstance(delta["content"], str) and delta["content"], delta
            content.append(delta["content"])
            continue
        (call,) = delta["tool_calls"]
        assert set(call) == {"index", "id", "type", "function"}
        assert call["index"] == len(calls) and call["type"] == "function"
        assert isinstance(call["id"], str) and call["id"] not in ids
        ids.add(call["id"])
        calls.append((call["function"]["name"], _as_args(call["function"]["arguments"])))
    joined = "".join(content)
    return (joined or None) if calls else joined, calls


def _parsed(parser_name: str, text: str) -> tuple[str | None, list[tuple[str, object]]]:
    content, calls = get_parser(parser_name).parse(text)
    for call in calls:
        assert set(call) == {"id", "type", "function"} and call["type"] == "function"
        assert set(call["function"]) == {"name", "arguments"}
        assert isinstance(call["function"]["arguments"], str)
    return content, [(c["function"]["name"], _as_args(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_parse(parser, text, content, calls):
    assert _parsed(parser, text) == (content, calls)


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_stream_split_anywhere(parser, text, content, calls):
    expected = (content, calls)
    assert _streamed(parser, [text]) == expected
    assert _streamed(parser, list(text)) == expected, "one character at a time"
    for cut in range(1, len(text)):
        assert _streamed(parser, [text[:cut], text[cut:]]) == expected, f"split at {cut}"
    rng = random.Random(len(text))
    for _ in range(20):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            pieces.append(text[i:i + n])
            i += n
        assert _streamed(parser, pieces) == expected, pieces


def test_text_without_calls_comes_back_unchanged():
    rng = random.Random(7)
    alphabet = 'ab {}[]":;,\n<|>_TOOLCALS' + "python_tag"
    for parser in ("llama3", "mistral"):
        for _ in range(300):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            content, calls = _parsed(parser, text)
            if not calls:
                assert content == text
                assert _streamed(parser, list(text)) == (text, [])


def test_content_is_not_held_back():
    """Plain text goes out as it comes; only what may begin the marker waits."""
    stream = get_parser("llama3").streamer()
    assert stream.feed("Hel") == [{"content": "Hel"}]
    assert stream.feed("lo <|py") == [{"content": "lo "}]
    assert stream.feed("thonic") == [{"content": "<|pythonic"}]
    assert stream.finish() == []
    stream = get_parser("mistral").streamer()
    assert stream.feed(" ") == []  # leading whitespace waits for what follows
    assert stream.feed("Sure [TOOL") == [{"content": " Sure "}]
    assert stream.feed("S]") == [{"content": "[TOOLS]"}]


def test_a_call_goes_out_once_its_json_closes():
    stream = get_parser("llama3").streamer()
    assert stream.feed('{"name": "f", "parameters": {"a": ') == []
    (delta,) = stream.feed("1}}")
    assert delta["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert stream.feed("; ") == [] and stream.finish() == []


def test_after_finish_a_stream_passes_text_through():
    stream = get_parser("llama3").streamer()
    stream.feed("hi")
    stream.finish()
    assert stream.feed(" more") == [{"content": " more"}]


def test_ids():
    llama = [c["id"] for c in get_parser("llama3").parse(CALL + ";" + CALL)[1]]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in llama) and len(set(llama)) == 2
    mistral = [c["id"] for c in get_parser("mistral").parse('[TOOL_CALLS][{"name": "f", "arguments": {}}]')[1]]
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in mistral)  # what Mistral's templates accept


def test_unclosed_call_region_is_bounded(monkeypatch):
    monkeypatch.setattr(tc, "MAX_CALL_CHARS", 1000)
    stream = get_parser("llama3").streamer()
    head = '{"name": "f", "parameters": {"a": "'
    assert stream.feed(head) == []
    out = []
    for _ in range(20):
        out += stream.feed("x" * 100)
    assert out and "".join(d["content"] for d in out) == head + "x" * 2000
    assert stream.feed("y") == [{"content": "y"}]


def test_long_arguments_are_scanned_once():
    """A call streamed in many small pieces costs time linear in its length (no re-parse per piece)."""
    import time

    body = '{"name": "f", "parameters": {"text": "' + "word " * 40000 + '"}}'
    stream = get_parser("llama3").streamer()
    t0 = time.perf_counter()
    out = []
    for i in range(0, len(body), 4):
        out += stream.feed(body[i:i + 4])
    elapsed = time.perf_counter() - t0
    assert len(out) == 1 and out[0]["tool_calls"][0]["function"]["name"] == "f"
    assert elapsed < 5.0, elapsed  # quadratic re-scanning of 200 kB in 4-byte pieces takes minutes


def test_string_arguments_pass_unchanged():
    _, calls = get_parser("llama3").parse('{"name": "f", "arguments": "{\\"a\\":1}"}')
    assert calls[0]["function"]["arguments"] == '{"a":1}'


def test_unknown_parser():
    with pytest.raises(ValueError, match="llama3, mistral"):
        get_parser("hermes")
