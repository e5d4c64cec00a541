"""The supervisor <-> worker message codec (worker/wire/codec.py, schema.py, writers.py), differential.

Reference: the codec's generic decoder (`_build` over the parsed JSON), which the fast decoders of Execute,
ExecuteColumns, ExecuteResult and ExecuteResultColumns must match exactly; the JSON parser each side really
uses sets what "the parsed JSON" is (json on the worker, orjson on the supervisor: `results.read`).

Data: one mode byte, then
- 0: a header frame as received (seeds: frames captured from a real server, fuzz/seeds/wire_seeds.py).
  Every decoder either refuses it with ProtocolError, as its reference does, or builds exactly the
  reference's message (types included: 1 is not True, 1.0 is not 1).
- 1: a message built from the bytes (every schema class, values of every JSON type within its field types),
  encoded by every writer that applies to it (`encode_header`; the supervisor's Execute / ExecuteColumns
  writers; the worker's ExecuteResult / ExecuteResultColumns / StreamResponse writers), decoded by the
  decoders of the side that receives it: the same message must come back.
- 2: such a message as its JSON object, changed in a few places (a value of another type, a key removed or
  added, a list for an object): checked as in mode 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any

import orjson
from _fdp import FDP, provider
from inferd.supervisor.instances import results
from inferd.worker.channel import header_loads
from inferd.worker.wire import codec, writers
from inferd.worker.wire import schema as s

ProtocolError = codec.ProtocolError
# what the supervisor reads with results.read (orjson); every other message is read with json
# (decode_header, by the worker and by the supervisor's BLS and metrics sockets)
SUPERVISOR_READS = frozenset((s.Hello, s.AutoCompleteResult, s.LoadResult, s.ExecuteResult, s.ExecuteResultColumns,
                              s.StreamResponse, s.Log, s.Bye))
CLASSES = list(s.MESSAGE_TYPES.values())
_HINTS: dict[type, dict[str, Any]] = {}


class Finding(AssertionError):
    pass


# ---- exact comparison -----------------------------------------------------------------------------------

def canon(value: Any) -> Any:
    """A form == compares exactly: types kept (bool is not int, float is not int), NaN equal to itself,
    -0.0 not 0.0, every dataclass field read (a fast decoder that left one unset fails here)."""
    t = type(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = []
        for f in dataclasses.fields(value):
            try:
                fields.append((f.name, canon(getattr(value, f.name))))
            except AttributeError:
                raise Finding(f"{t.__name__}.{f.name} is not set") from None
        if set(vars(value)) - {f.name for f in dataclasses.fields(value)}:
            raise Finding(f"{t.__name__} holds attributes that are not its fields: {sorted(vars(value))}")
        return (t.__name__, tuple(fields))
    if t is float:
        return ("float", "nan" if math.isnan(value) else repr(value))
    if t is list or t is tuple:
        return ("list", tuple(canon(v) for v in value))
    if t is dict:
        return ("dict", tuple(sorted((k, canon(v)) for k, v in value.items())))
    return (t.__name__, value)


# ---- references -----------------------------------------------------------------------------------------

def orjson_then_json(raw: bytes) -> Any:
    """What the supervisor parses a worker's header with: orjson, json where orjson refuses."""
    try:
        return orjson.loads(raw)
    except ValueError:
        return json.loads(raw)


def generic(raw: bytes, loads: Any) -> Any:
    """The generic decoder's message for `raw` parsed by `loads`; ProtocolError where it refuses."""
    try:
        header = loads(raw)
        if type(header) is not dict:
            raise TypeError("not an object")
        return codec._build(s.MESSAGE_TYPES[header.pop("t")], header)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ProtocolError(str(exc)) from None


def outcome(fn: Any, *args: Any) -> Any:
    """("ok", canon(message)) or ("refused",); anything but ProtocolError propagates (a finding)."""
    try:
        return ("ok", canon(fn(*args)))
    except ProtocolError:
        return ("refused",)


def plain_result_canon(p: results.PlainResult) -> Any:
    """A PlainResult (results.read's form of a plain ExecuteResult) as the ExecuteResult it stands for."""
    h = dict(p.header)
    del h["t"]
    responses = [s.ResponseItem(r["request_id"], [s.TensorRef(**ref) for ref in r["outputs"]]) for r in h["responses"]]
    return canon(s.ExecuteResult(**{**h, "responses": responses}))


def read_supervisor(raw: bytes) -> Any:
    msg, _ = results.read([raw])
    return msg


def check_header(raw: bytes) -> None:
    """Every decoder against its reference (mode 0 and 2)."""
    want_json = outcome(generic, raw, json.loads)
    for name, got in (("decode_header", outcome(codec.decode_header, raw)),
                      ("decode_header(header_loads)", outcome(codec.decode_header, raw, header_loads)),
                      ("decode", outcome(lambda r: codec.decode([r, b"x"])[0], raw))):
        if got != want_json:
            raise Finding(f"{name}: {got!r} != generic {want_json!r} for {raw[:300]!r}")
    want_orjson = outcome(generic, raw, orjson_then_json)
    try:
        msg = read_supervisor(raw)
        got = ("ok", plain_result_canon(msg) if type(msg) is results.PlainResult else canon(msg))
    except ProtocolError:
        got = ("refused",)
    if got != want_orjson:
        raise Finding(f"results.read: {got!r} != generic(orjson) {want_orjson!r} for {raw[:300]!r}")
    dec = outcome(lambda r: results.decode([r])[0], raw)
    if dec != want_orjson:
        raise Finding(f"results.decode: {dec!r} != generic(orjson) {want_orjson!r} for {raw[:300]!r}")


# ---- structured values ----------------------------------------------------------------------------------

_CHARS = ["a", "Z", "0", " ", '"', "\\", "/", "\n", "\x00", "\x7f", "é", "☃", "\U0001f600", "\ud800", "\udcff",
          "t", "{", "}", ":", ","]
_NAMES = ["INPUT0", "OUTPUT0", "X", "", "t", "name", "loc", "frame", "\u00e9", "a/b"]
_DTYPES = ["FP32", "INT64", "BYTES", "BOOL", "BF16", "", "fp32"]


def gen_str(fdp: FDP) -> str:
    if fdp.ConsumeBool():
        return fdp.PickValueInList(_NAMES)
    text = "".join(fdp.PickValueInList(_CHARS) for _ in range(fdp.ConsumeIntInRange(0, 6)))
    # a high surrogate then a low one is not a Python string JSON can carry: "\ud800\udcff" reads back as
    # one code point (a string of lone surrogates, as surrogateescape makes, never has that pair)
    return text.replace("\ud800\udcff", "\ud800.\udcff")


class _Limits:
    wide_ints = True  # ints beyond 64 bits: not in what a worker writes (ids come from the supervisor,
    # pb_utils keeps parameters to int64): orjson would read them as floats


def gen_int(fdp: FDP) -> int:
    kind = fdp.ConsumeIntInRange(0, 5 if _Limits.wide_ints else 3)
    if kind == 0:
        return fdp.ConsumeIntInRange(0, 3)
    if kind == 1:
        return fdp.ConsumeIntInRange(-(1 << 31), (1 << 31) - 1)
    if kind == 2:
        return fdp.ConsumeIntInRange(-(1 << 63), (1 << 63) - 1)
    if kind == 3:
        return fdp.ConsumeIntInRange(0, (1 << 64) - 1)
    if kind == 4:
        return fdp.ConsumeIntInRange(0, (1 << 63) - 1) << 40  # beyond 64 bits
    return -1


def gen_json(fdp: FDP, depth: int = 0) -> Any:
    """Any JSON value (what `Any` fields and parameters may hold)."""
    kind = fdp.ConsumeIntInRange(0, 8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return gen_int(fdp)
    if kind == 3:
        return fdp.PickValueInList([0.5, -0.0, 1e300, 1.0, 3.14, float("nan"), float("inf"), 1e-320])
    if kind in (4, 5):
        return gen_str(fdp)
    if kind in (6, 7):
        return [gen_json(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {gen_str(fdp): gen_json(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = _HINTS[cls] = typing.get_type_hints(cls)
    return h


def gen_typed(fdp: FDP, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp is int:
        return gen_int(fdp)
    if tp is str:
        return gen_str(fdp)
    if tp is bool:
        return fdp.ConsumeBool()
    if tp is Any:
        return gen_json(fdp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [gen_typed(fdp, item) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if origin is dict:
        return {gen_str(fdp): gen_json(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    if origin is typing.Union:  # Optional[X]
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if fdp.ConsumeBool() else gen_typed(fdp, inner)
    if dataclasses.is_dataclass(tp):
        return gen_message(fdp, tp)
    raise AssertionError(f"no generator for {tp!r}")


def gen_tensor_ref(fdp: FDP) -> s.TensorRef:
    """A TensorRef as the writers produce them: loc frame (no region, device, owner), shm, or cuda."""
    loc = fdp.PickValueInList(["frame", "shm", "cuda"])
    ref = s.TensorRef(fdp.PickValueInList(_NAMES) if fdp.ConsumeBool() else gen_str(fdp),
                      fdp.PickValueInList(_DTYPES), [gen_int(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))],
                      loc, gen_int(fdp), "" if loc == "frame" else gen_str(fdp), gen_int(fdp), gen_int(fdp))
    if loc == "cuda":
        ref.device, ref.owner = gen_int(fdp), gen_str(fdp)
    return ref


def gen_message(fdp: FDP, cls: type) -> Any:
    if cls is s.TensorRef:
        return gen_tensor_ref(fdp)
    h = hints(cls)
    kwargs = {f.name: gen_typed(fdp, h[f.name]) for f in dataclasses.fields(cls)}
    if cls is s.RequestItem or cls is s.BlsRequest:
        kwargs["parameters"] = json.dumps(gen_json(fdp)) if fdp.ConsumeBool() else "{}"
        # a sequence id is an int or a string (a float would be written as orjson writes floats: inf as null)
        kwargs["correlation_id"] = gen_int(fdp) if fdp.ConsumeBool() else gen_str(fdp)
    return cls(**kwargs)


# ---- the writers of each message ------------------------------------------------------------------------

def _ref_text(ref: s.TensorRef) -> str:
    if ref.loc == "frame":
        return writers.output_ref_json(ref.name, ref.datatype, tuple(ref.shape), ref.frame, ref.offset, ref.nbytes)
    if ref.loc == "shm":
        if ref.offset != 0 or ref.frame != -1:
            ref.offset, ref.frame = 0, -1  # what the worker's own regions are written as
        return writers.output_shm_ref_json(ref.name, ref.datatype, ref.shape, ref.region, ref.nbytes)
    ref.frame = -1
    return writers.device_ref_json(ref.name, ref.datatype, ref.shape, ref.region, ref.offset, ref.nbytes, ref.device,
                                   ref.owner)


def _item_text(item: s.ResponseItem) -> str:
    return writers.response_item_json(item.request_id, [_ref_text(r) for r in item.outputs], item.error,
                                      item.parameters)


def plain_writers(msg: Any) -> list[bytes]:
    """The headers the request path's writers make of `msg` (which they may adjust to their contract)."""
    cls = type(msg)
    if cls is s.ExecuteResult:
        return [writers.execute_result_header(msg.batch_id, [_item_text(i) for i in msg.responses],
                                              msg.compute_input_ns, msg.compute_infer_ns, msg.compute_output_ns)]
    if cls is s.StreamResponse:
        return [writers.stream_response_header(msg.request_id, msg.final,
                                               None if msg.response is None else _item_text(msg.response))]
    if cls is s.ExecuteResultColumns:
        for i, column in enumerate(msg.outputs):
            column.frame = i
        return [writers.execute_result_columns_header(
            msg.batch_id, msg.request_ids, [(c.name, c.datatype, c.shape) for c in msg.outputs],
            msg.compute_input_ns, msg.compute_infer_ns, msg.compute_output_ns)]
    if cls is s.Execute:
        items = []
        for r in msg.requests:
            for ref in r.inputs:
                if ref.loc != "cuda":
                    ref.device, ref.owner = 0, ""
            items.append(writers.request_item(
                r.request_id, r.id, [writers.tensor_ref(t.name, t.datatype, t.shape, t.loc, t.frame, t.region,
                                                        t.offset, t.nbytes, t.device, t.owner) for t in r.inputs],
                r.requested_outputs, r.parameters, r.correlation_id, r.flags, r.timeout_us, r.device_outputs,
                r.trace))
        return [writers.execute_header(msg.batch_id, items, msg.forget_regions, msg.poll_us)]
    if cls is s.ExecuteColumns:
        for i, column in enumerate(msg.inputs):
            column.frame = i
        if not any(msg.ids):
            msg.ids = []  # "`ids` is empty when every client id is empty"
        return [writers.execute_columns_header(msg.batch_id, msg.request_ids,
                                               [(c.name, c.datatype, c.shape) for c in msg.inputs], msg.ids,
                                               msg.requested_outputs, msg.forget_regions, msg.poll_us)]
    return []


def gen_top(fdp: FDP, cls: type) -> Any:
    _Limits.wide_ints = cls not in SUPERVISOR_READS
    try:
        return gen_message(fdp, cls)
    finally:
        _Limits.wide_ints = True


def roundtrip(fdp: FDP) -> None:
    cls = fdp.PickValueInList(CLASSES)
    msg = gen_top(fdp, cls)
    try:
        headers = plain_writers(msg)
    except TypeError:  # orjson refuses what the supervisor never writes (a lone surrogate, an int beyond 64 bits)
        headers = []
    try:
        headers.append(codec.encode_header(msg))
    except ValueError:  # json refuses NaN/inf? (allow_nan is on: it does not) - never expected
        raise
    want = canon(msg)
    for raw in headers:
        if cls in SUPERVISOR_READS:
            decoded = [("results.read", lambda r: read_supervisor(r))]
        else:
            decoded = [("decode_header", codec.decode_header), ("decode_header(header_loads)",
                                                                 lambda r: codec.decode_header(r, header_loads))]
        for name, decode in decoded:
            try:
                got = decode(raw)
            except ProtocolError as exc:
                raise Finding(f"{name} refuses what the writer wrote ({exc}): {raw[:300]!r}") from None
            got_c = plain_result_canon(got) if type(got) is results.PlainResult else canon(got)
            if got_c != want:
                raise Finding(f"{name} read {got_c!r}, was written from {want!r}: {raw[:300]!r}")
        check_header(raw)


# ---- mutated headers ------------------------------------------------------------------------------------

def mutate(fdp: FDP, doc: Any) -> Any:
    """`doc` with one change at a path the bytes choose."""
    if isinstance(doc, (dict, list)) and doc and fdp.ConsumeIntInRange(0, 3):
        keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
        k = fdp.PickValueInList(keys)
        doc[k] = mutate(fdp, doc[k])
        return doc
    action = fdp.ConsumeIntInRange(0, 4)
    if action == 0 or not isinstance(doc, (dict, list)):
        return gen_json(fdp)
    if action == 1 and doc:
        k = fdp.PickValueInList(list(doc) if isinstance(doc, dict) else list(range(len(doc))))
        del doc[k]
        return doc
    if action == 2 and isinstance(doc, dict):
        doc[fdp.PickValueInList(["extra", "t", "loc", "error", "parameters", "outputs", "poll_us"])] = gen_json(fdp)
        return doc
    if action == 3:
        return [doc]
    return doc


def mutated(fdp: FDP) -> None:
    msg = gen_top(fdp, fdp.PickValueInList(CLASSES))
    try:
        raw = (plain_writers(msg) or [codec.encode_header(msg)])[-1] if fdp.ConsumeBool() else codec.encode_header(msg)
    except TypeError:
        raw = codec.encode_header(msg)
    doc = json.loads(raw)
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        doc = mutate(fdp, doc)
    check_header(json.dumps(doc, separators=(",", ":")).encode())


def test_one_input(data: bytes) -> None:
    if not data:
        return
    mode = data[0] % 3
    if mode == 0:
        check_header(data[1:])
    elif mode == 1:
        roundtrip(provider(data[1:]))
    else:
        mutated(provider(data[1:]))
