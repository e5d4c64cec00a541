"""Simple-form JSON inference requests remembered by their bytes, less the values that change.

A client that sends JSON requests (wrk, perf_analyzer, a tritonclient loop) sends the same document again
and again with new `data` values, and perhaps a new `id`: same names, datatypes, shapes, outputs, key
order and spacing. Once json_request.parse_plain has read such a document, its bytes become a pattern:
each input's `data` array and the `id` string are holes, everything else must match byte for byte. A body
that matches is that document with other values in the holes, so it is read without parsing and checking
the rest again (each hole is still read by orjson and checked as parse_plain checks it); a hole whose
value parse_plain would refuse makes the whole body go the usual way, so errors come from one place.

A pattern is learnt only from a document parse_plain took, whose every key is spelled without escapes
and appears once: there the holes are found by their keys alone.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import orjson
from inferd.supervisor.inference.tensors import pack_plain
from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor

from .json_request import PLAIN
from .parsed import OutputPlan, ParsedInfer

MAX_BODY = 4096  # longer bodies are parsed every time
PER_MODEL = 4  # patterns per model version (the oldest goes when a fifth is learnt)
MAX_MODELS = 256  # model versions with patterns; the table is cleared when full
MAX_LEARNT = 64  # patterns learnt per model version at most: a client whose bodies never repeat stops costing

_DATA_HOLE = rb"(\[[0-9eE+\-., \t\r\n]*\])"  # a flat array of numbers (orjson reads it); no string, no nesting
_ID_HOLE = rb'("(?:[^"\\]|\\.)*")'  # one JSON string
_LONG_INT = re.compile(rb"[0-9]{16}")  # 16 digits in a row: maybe an int beyond 2**53 (or a long fraction)
_TOKEN = re.compile(rb'[ \t\r\n]*(?:("(?:[^"\\]|\\.)*")|([\[\]{}:,])|([^ \t\r\n\[\]{}:,"]+))')


class JsonTemplate:
    __slots__ = ("pattern", "id_group", "rid", "inputs", "outputs")

    def __init__(self, pattern: re.Pattern[bytes], id_group: int, rid: str,
                 inputs: list[tuple[str, str, list[int], Callable[..., bytes], str, bool, int, int]],
                 outputs: list[tuple[str, bool | None]]) -> None:
        self.pattern = pattern
        self.id_group = id_group  # the id's group, 0 if the document has no id (`rid` then)
        self.rid = rid
        # (name, datatype, shape, struct packer of its `count` values, array typecode, float type, count, group)
        self.inputs = inputs
        self.outputs = outputs  # (name, binary_data or None)

    def fill(self, model: str, version: str, body: bytes) -> ParsedInfer | None:
        """`body` read by this pattern, or None when it does not match or a hole holds what parse_plain
        would refuse."""
        m = self.pattern.fullmatch(body)
        if m is None:
            return None
        rid = self.rid
        try:
            if self.id_group:
                rid = orjson.loads(m.group(self.id_group))
            tensors = []
            for name, datatype, shape, pack, code, is_float, count, group in self.inputs:
                hole = m.group(group)
                data = orjson.loads(hole)  # numbers only: the hole holds no string, true, false or null
                if not is_float or _LONG_INT.search(hole) is None:
                    # exactly `count` values, as the array module packs them (ints of 15 digits at most are
                    # exact as floats); a float for an integer type, an int out of its range, a float beyond
                    # FP32's range (array makes it inf: parse_plain's way does) raise
                    packed = pack(*data)
                else:  # ints that may not be exact as floats are checked as parse_plain checks them
                    checked = pack_plain(code, data) if len(data) == count else None
                    if checked is None:
                        return None
                    packed = checked
                tensors.append(Tensor(name, datatype, list(shape), packed, {}))
        except (orjson.JSONDecodeError, struct.error, OverflowError, TypeError):
            return None
        request = InferRequest(model, version, rid, tensors)
        parsed = ParsedInfer(request)
        if self.outputs:
            plans = parsed.plans
            requested = request.outputs
            for name, binary in self.outputs:
                plans[name] = OutputPlan(binary)
                requested.append(RequestedOutput(name, {} if binary is None else {"binary_data": binary}))
        return parsed

    @classmethod
    def learn(cls, body: bytes, doc: dict[str, Any], parsed: ParsedInfer) -> JsonTemplate | None:
        """The pattern of `body`, which parse_plain read as `doc` into `parsed`; None when its holes cannot
        be told by their keys alone."""
        holes = _holes(body, len(parsed.request.inputs), "id" in doc)
        if holes is None:
            return None
        data_spans, id_span = holes
        spans = sorted([(span, "data", i) for i, span in enumerate(data_spans)]
                       + ([(id_span, "id", 0)] if id_span is not None else []))
        parts = []
        pos = 0
        groups: dict[tuple[str, int], int] = {}
        for n, ((start, end), kind, i) in enumerate(spans, 1):
            parts.append(re.escape(body[pos:start]))
            parts.append(_DATA_HOLE if kind == "data" else _ID_HOLE)
            groups[kind, i] = n
            pos = end
        parts.append(re.escape(body[pos:]))
        pattern = re.compile(b"".join(parts), re.DOTALL)
        inputs = []
        for i, t in enumerate(parsed.request.inputs):
            code, _itemsize, is_float = PLAIN[t.datatype]
            count = 1
            for d in t.shape:
                count *= d
            pack = struct.Struct("<%d%s" % (count, code)).pack  # little-endian, standard sizes: the wire form
            inputs.append((t.name, t.datatype, list(t.shape), pack, code, is_float, count, groups["data", i]))
        outputs = [(o.name, parsed.plans[o.name].binary) for o in parsed.request.outputs]
        tpl = cls(pattern, groups.get(("id", 0), 0), parsed.request.id, inputs, outputs)
        # the pattern reads this body back as parse_plain did, or it is not kept
        again = tpl.fill(parsed.request.model_name, parsed.request.model_version, body)
        if again is None or again.request.id != parsed.request.id or [
                (t.name, t.datatype, t.shape, t.data) for t in again.request.inputs] != [
                (t.name, t.datatype, t.shape, t.data) for t in parsed.request.inputs]:
            return None
        return tpl


def _holes(body: bytes, n_inputs: int, has_id: bool) -> tuple[list[tuple[int, int]], tuple[int, int] | None] | None:
    """The byte spans of each input's `data` array (in order) and of the `id` string, found by walking the
    tokens of `body`; None unless every key on the way is plain and given once (`inputs` once, `id` once
    if `has_id`, one `data` in each of `n_inputs` input objects)."""
    stack: list[list[Any]] = []  # per open container: [kind, key being read (objects), start, is a hole]
    data: list[tuple[int, int]] = []
    ident = None
    counts = {b'"inputs"': 0, b'"id"': 0}
    items = 0
    item_data = 0
    pos = 0
    size = len(body)
    while pos < size:
        m = _TOKEN.match(body, pos)
        if m is None:
            if body[pos:].strip(b" \t\r\n"):
                return None
            break
        text, punct, _other = m.groups()
        start = m.start(m.lastindex or 0)
        pos = m.end()
        depth = len(stack)
        top = stack[-1] if stack else None
        if punct == b"{" or punct == b"[":
            hole = False
            if depth == 2 and punct == b"{" and stack[0][1] == b'"inputs"' and stack[1][0] == b"[":
                if items and item_data != 1:
                    return None
                items += 1
                item_data = 0
            elif depth == 3 and punct == b"[" and top is not None and top[0] == b"{" and top[1] == b'"data"' \
                    and stack[0][1] == b'"inputs"' and stack[1][0] == b"[":
                hole = True
            stack.append([punct, None, start, hole])
        elif punct == b"}" or punct == b"]":
            if not stack:
                return None
            kind, _key, begin, hole = stack.pop()
            if hole:
                data.append((begin, pos))
        elif punct == b",":
            if top is not None and top[0] == b"{":
                top[1] = None
        elif text is not None and top is not None and top[0] == b"{" and top[1] is None:
            if b"\\" in text:
                return None  # an escaped key: not told by its bytes
            top[1] = text  # a key (the ':' follows)
            if depth == 1 and text in counts:
                counts[text] += 1
            elif depth == 3 and text == b'"data"' and stack[0][1] == b'"inputs"':
                item_data += 1
        elif text is not None and depth == 1 and top is not None and top[1] == b'"id"':
            ident = (start, pos)
    if stack or (items and item_data != 1) or items != n_inputs or len(data) != n_inputs:
        return None
    if counts[b'"inputs"'] != 1 or counts[b'"id"'] != (1 if has_id else 0) or (has_id and ident is None):
        return None
    return data, ident


class JsonTemplates:
    """The patterns of one codec, per model version."""

    def __init__(self) -> None:
        # model version -> its patterns, newest last (the codec tries each one's `fill` in turn)
        self.by_model: dict[tuple[str, str], list[JsonTemplate]] = {}
        self._learnt: dict[tuple[str, str], int] = {}

    def learn(self, model: str, version: str, body: bytes, doc: dict[str, Any], parsed: ParsedInfer) -> None:
        key = (model, version)
        learnt = self._learnt.get(key, 0)
        if learnt >= MAX_LEARNT or len(body) > MAX_BODY:
            return
        if len(self._learnt) >= MAX_MODELS and key not in self._learnt:
            self.by_model.clear()
            self._learnt.clear()
        self._learnt[key] = learnt + 1
        tpl = JsonTemplate.learn(body, doc, parsed)
        if tpl is None:
            return
        templates = self.by_model.setdefault(key, [])
        if len(templates) >= PER_MODEL:
            del templates[0]
        templates.append(tpl)
