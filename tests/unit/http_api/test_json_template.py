"""JSON bodies read by a learnt pattern (http_api.json_template) give what a fresh parse gives.

Each case is a body the codec learns from, then bodies that differ from it: new data and ids (the holes),
values in the holes that the simple form refuses, and changes outside the holes. Every body read by the
codec that has learnt must give the request, or the error, that a codec seeing it first gives.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from inferd.supervisor.http_api import json_template
from inferd.supervisor.http_api.codec import InferCodec
from inferd.worker.wire.errors import InferdError

from .fake_dataplane import FakeDataPlane
from .parsed_fields import parsed_fields as _fields


def _outcome(codec: InferCodec, body: bytes) -> Any:
    try:
        return ("ok", _fields(codec.parse("m", "", {}, body)))
    except InferdError as exc:
        return ("error", exc.code, exc.message)


def _check(learnt: bytes, *bodies: bytes) -> InferCodec:
    codec = InferCodec(FakeDataPlane())
    assert _outcome(codec, learnt)[0] == "ok"
    for body in bodies:
        assert _outcome(codec, body) == _outcome(InferCodec(FakeDataPlane()), body), body
    return codec


def _patterns(codec: InferCodec) -> int:
    return sum(len(v) for v in codec._json_templates.by_model.values())


BASE = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}'
VARIANTS = [
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [5, 6.5, -7, 8e3]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [ 5 ,6,7 ,\n8 ]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3]}]}',  # too few
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": []}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 9007199254740993]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 9007199254740992]}]}',
    # 2**60 + 2**36 + 1: through a double it lands on a float32 tie (and rounds down), numpy rounds it up
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 1152921573326323713]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 0.12345678901234567]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 1e400]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.5, 2.5, 3.5, 1e39]}]}',  # inf
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4, 5]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2,, 4]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, -]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, true]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, "4"]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [[1, 2], [3, 4]]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]}',  # new shape
    b'{"inputs": [{"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}], "id": "x"}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]} ',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}x',
    b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]',
]


def test_new_data_is_read_by_the_pattern_and_matches_a_fresh_parse() -> None:
    codec = _check(BASE)
    assert all(codec._json_templates.by_model["m", ""][0].fill("m", "", body) for body in VARIANTS[:2])
    _check(BASE, *VARIANTS)


def _doc(datatype: str, data: list[Any], rid: Any = None, outputs: Any = None) -> bytes:
    doc: dict[str, Any] = {}
    if rid is not None:
        doc["id"] = rid
    doc["inputs"] = [{"name": "A", "datatype": datatype, "shape": [len(data)], "data": data},
                     {"name": "B", "datatype": datatype, "shape": [1, len(data)], "data": data[::-1]}]
    if outputs is not None:
        doc["outputs"] = outputs
    return json.dumps(doc, separators=(",", ":")).encode()


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
                                      "UINT32", "UINT64"])
def test_every_numeric_datatype_with_ids_and_outputs(datatype: str) -> None:
    outputs = [{"name": "O0"}, {"name": "O1", "parameters": {"binary_data": True}}]
    learnt = _doc(datatype, [1, 2, 3], "r1", outputs)
    codec = _check(learnt,
                   _doc(datatype, [4, 5, 6], "r2", outputs),
                   _doc(datatype, [4, 5, 6], 'q"uo\\te \u00e9', outputs),
                   _doc(datatype, [4, 5, 6], "", outputs),
                   _doc(datatype, [4, 5, 6], "ends in a backslash \\", outputs),
                   _doc(datatype, [4, 5, 6], "\\\"", outputs),
                   _doc(datatype, [4, 5, 6], 7, outputs),  # not a string
                   _doc(datatype, [4, 5, 6], ["r"], outputs),
                   _doc(datatype, [1.5, 2, 3], "r3", outputs),  # a float for an integer type
                   _doc(datatype, [True, 2, 3], "r3", outputs),  # booleans are not numbers here
                   _doc(datatype, [1, 2, None], "r3", outputs),
                   _doc(datatype, [-1, 2, 3], "r4", outputs),  # negative for an unsigned one
                   _doc(datatype, [300, 2, 3], "r5", outputs),  # beyond 8 bits
                   _doc(datatype, [2 ** 63, 2, 3], "r6", outputs),
                   _doc(datatype, [2 ** 64 - 1, 2, 3], "r7", outputs),
                   _doc(datatype, [4, 5, 6], "r8", [{"name": "O0"}]),  # other outputs: not the pattern
                   _doc(datatype, [4, 5, 6], None, outputs))
    body = _doc(datatype, [7, 8, 9], "r9", outputs)
    assert any(tpl.fill("m", "", body) for tpl in codec._json_templates.by_model["m", ""])
    first = codec.parse("m", "", {}, body)
    second = codec.parse("m", "", {}, body)
    assert first.request is not second.request and first.request.inputs[0].shape is not \
        second.request.inputs[0].shape  # every request gets objects of its own
    assert first.plans is not second.plans and first.request.outputs is not second.request.outputs


def test_a_body_no_key_tells_apart_is_never_learnt() -> None:
    item = '"name":"A","datatype":"FP32","shape":[2]'
    for learnt, other in [
        # "data" twice: the last one counts, a pattern could not tell which one changed
        ('{"inputs":[{%s,"data":[1,2],"data":[3,4]}]}' % item, '{"inputs":[{%s,"data":[5,6],"data":[3,4]}]}' % item),
        ('{"inputs":[{%s,"data":[1,2],"data":[3,4]}]}' % item, '{"inputs":[{%s,"data":[1,2],"data":[5,6]}]}' % item),
        ('{"inputs":[{%s,"data":[1,2],"data":[1,2]}]}' % item, '{"inputs":[{%s,"data":[1,2],"data":[5,6]}]}' % item),
        ('{"inputs":[{%s,"data":[1,2],"data":[1,2]}]}' % item, '{"inputs":[{%s,"data":[5,6],"data":[1,2]}]}' % item),
        # "inputs" twice, "id" twice
        ('{"inputs":[],"inputs":[{%s,"data":[1,2]}]}' % item, '{"inputs":[],"inputs":[{%s,"data":[5,6]}]}' % item),
        ('{"id":"a","id":"b","inputs":[{%s,"data":[1,2]}]}' % item,
         '{"id":"c","id":"b","inputs":[{%s,"data":[1,2]}]}' % item),
        # keys spelled with escapes
        ('{"inputs":[{%s,"data":[1,2]}],"input\\u0073":[{%s,"data":[1,2]}]}' % (item, item),
         '{"inputs":[{%s,"data":[5,6]}],"input\\u0073":[{%s,"data":[1,2]}]}' % (item, item)),
        ('{"inputs":[{%s,"d\\u0061ta":[1,2]}]}' % item, '{"inputs":[{%s,"d\\u0061ta":[5,6]}]}' % item),
        ('{"\\u0069d":"a","inputs":[{%s,"data":[1,2]}]}' % item,
         '{"\\u0069d":"b","inputs":[{%s,"data":[1,2]}]}' % item),
    ]:
        codec = _check(learnt.encode(), other.encode(), learnt.encode())
        assert _patterns(codec) == 0, learnt


def test_patterns_are_bounded_and_learning_stops() -> None:
    codec = InferCodec(FakeDataPlane())
    for n in range(1, json_template.MAX_LEARNT + 20):
        body = _doc("FP32", list(range(n)))
        assert _outcome(codec, body)[0] == "ok"
    assert _patterns(codec) == json_template.PER_MODEL
    assert codec._json_templates._learnt[("m", "")] == json_template.MAX_LEARNT


def test_a_body_over_the_size_limit_is_parsed_each_time() -> None:
    body = _doc("FP64", [0.5] * 1000)
    assert len(body) > json_template.MAX_BODY
    codec = _check(body, body)
    assert _patterns(codec) == 0


def test_random_mutations_of_a_learnt_body_read_as_a_fresh_parse_reads_them() -> None:
    # a client's bytes, cut, grown and changed at random around and inside the holes: the learnt codec must
    # answer each exactly as a codec that never saw the original does (same request, or same error)
    import random
    rnd = random.Random(25)
    learnt = b'{"id": "r1", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}'
    codec = InferCodec(FakeDataPlane())
    assert _outcome(codec, learnt)[0] == "ok"
    alphabet = b'0123456789.-+eE,[]{}": \\tnulx'
    for _ in range(3000):
        body = bytearray(learnt)
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(body) + 1)
            kind = rnd.randrange(3)
            if kind == 0 and at < len(body):
                body[at] = rnd.choice(alphabet)
            elif kind == 1:
                body[at:at] = bytes([rnd.choice(alphabet)])
            elif at < len(body):
                del body[at]
        case = bytes(body)
        assert _outcome(codec, case) == _outcome(InferCodec(FakeDataPlane()), case), case
