"""Requests for tests/e2e/test_differential_triton.py: what one inference request is (RequestSpec), the
Hypothesis strategy that draws valid ones, and explicit examples of every datatype sent each way
(differential_wire.py sends them).

The models (tests/fixtures/models/diff_identity, its non-batching twin, examples/add_sub) are identities
over every datatype and add_sub, so the outputs a request yields are known from its inputs.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

IDENTITY = "diff_identity"  # max_batch_size 4, dims [-1, -1]: shapes [b, m, n]
IDENTITY_NOBATCH = "diff_identity_nobatch"  # max_batch_size 0, dims [-1]: shapes [n]
ADD_SUB = "add_sub"  # FP32 [16] twice -> sum and difference
MAX_BATCH = 4

NUMPY = {
    "BOOL": np.dtype(np.bool_), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "FP16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16),
    "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"), "BYTES": np.dtype(np.object_),
}
DATATYPES = list(NUMPY)
NO_JSON = ("FP16", "BF16")  # both servers refuse these as JSON data, in and out (a test of its own)
# request parameters the servers read themselves: drawn keys never take these names
RESERVED = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
            "headers"}


@dataclass
class InputSpec:
    name: str
    datatype: str
    shape: list[int]
    array: np.ndarray
    encoding: str  # "json" (HTTP data / gRPC typed contents), "binary" (HTTP extension / gRPC raw), "shm"

    def wire(self) -> bytes:
        """The tensor's bytes as both protocols carry them (BYTES: 4-byte little-endian length prefixes)."""
        if self.datatype == "BYTES":
            return b"".join(struct.pack("<I", len(b)) + b for b in self.array.reshape(-1))
        return self.array.tobytes()

    def json_data(self) -> list[Any]:
        flat = self.array.reshape(-1)
        if self.datatype == "BYTES":
            return [b.decode("utf-8") for b in flat]
        return flat.tolist()  # bool, int or float (FP32 values are exact as Python floats)

    def utf8(self) -> bool:
        if self.datatype != "BYTES":
            return True
        try:
            for b in self.array.reshape(-1):
                b.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True


@dataclass
class OutputSpec:
    name: str
    binary: bool | None  # HTTP `binary_data`; None leaves the parameter out
    shm: bool


@dataclass
class RequestSpec:
    model: str
    inputs: list[InputSpec]
    outputs: list[OutputSpec] | None  # None: no `outputs` (every output the model gives)
    request_id: str | None
    parameters: dict[str, Any]
    binary_data_output: bool | None  # HTTP request parameter; None leaves it out
    ascii_json: bool = True  # HTTP body: non-ASCII as \u escapes or as UTF-8
    shm_gap: int = 0  # bytes between two tensors in a shared-memory segment (unaligned offsets at times)
    expected: dict[str, int] = field(default_factory=dict)  # output name -> its byte size

    def __repr__(self) -> str:  # what Hypothesis prints for a falsifying example
        ins = ", ".join(f"{t.name}{t.shape}:{t.encoding}={t.array.reshape(-1).tolist()!r}" for t in self.inputs)
        return (f"RequestSpec({self.model}, inputs=[{ins}], outputs={self.outputs}, id={self.request_id!r}, "
                f"parameters={self.parameters}, binary_data_output={self.binary_data_output}, "
                f"ascii_json={self.ascii_json})")

    @property
    def uses_shm(self) -> bool:
        return any(t.encoding == "shm" for t in self.inputs) or any(o.shm for o in self.outputs or ())


# ---------------------------------------------------------------- drawing valid requests

def _values(datatype: str, count: int) -> st.SearchStrategy[np.ndarray]:
    dt = NUMPY[datatype]
    if datatype == "BOOL":
        elems: st.SearchStrategy[Any] = st.booleans()
    elif datatype == "BYTES":  # UTF-8 text (JSON-able) or any bytes, NULs and invalid UTF-8 included
        elems = st.one_of(st.text(max_size=6).map(lambda s: s.encode("utf-8")), st.binary(max_size=8))
        return st.lists(elems, min_size=count, max_size=count).map(lambda v: np.array(v, dtype=object))
    elif datatype in ("FP16", "BF16"):  # every bit pattern: NaN payloads, infinities, subnormals, -0
        return st.lists(st.integers(0, 0xFFFF), min_size=count, max_size=count).map(
            lambda v: np.array(v, dtype="<u2").view(dt))
    elif datatype in ("FP32", "FP64"):
        elems = st.floats(width=32 if datatype == "FP32" else 64)  # NaN, +-inf, -0.0, extremes included
    else:
        info = np.iinfo(dt)
        elems = st.integers(int(info.min), int(info.max))
    return st.lists(elems, min_size=count, max_size=count).map(lambda v: np.array(v, dtype=dt))


# FP64 numbers Triton's rapidjson reads exactly (its fast path: at most 15 digits, a power of ten within
# 1e+-22); others it may read one ULP off (see the test), so a JSON FP64 input holds these only
_JSON_FP64 = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0]),
    st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(-(10**15 - 1), 10**15 - 1), st.integers(-22, 22)))


@st.composite
def _tensor(draw: Any, name: str, datatype: str, shape: list[int]) -> InputSpec:
    count = int(np.prod(shape))
    choices = ["binary", "shm"] if datatype in NO_JSON else ["json", "binary", "shm"]
    encoding = draw(st.sampled_from(choices))
    if datatype == "FP64" and encoding == "json":
        values = st.lists(_JSON_FP64, min_size=count, max_size=count).map(lambda v: np.array(v, dtype="<f8"))
    else:
        values = _values(datatype, count)
    t = InputSpec(name, datatype, shape, draw(values).reshape(shape), encoding)
    if encoding == "json" and not t.utf8():  # a JSON string is text
        t.encoding = draw(st.sampled_from(["binary", "shm"]))
    if t.encoding == "shm" and not t.wire():  # Triton refuses a zero-byte shared-memory tensor (see the test)
        t.encoding = "binary"
    return t


_PARAM_VALUES = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
                          st.floats(allow_nan=False, allow_infinity=False))
_PARAM_KEYS = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True).filter(
    lambda k: k not in RESERVED and not k.startswith("triton_"))


@st.composite
def requests(draw: Any) -> RequestSpec:
    """One valid request for one of the three models, with what each output will hold."""
    model = draw(st.sampled_from([IDENTITY, IDENTITY, IDENTITY_NOBATCH, IDENTITY_NOBATCH, ADD_SUB]))
    inputs: list[InputSpec] = []
    if model == ADD_SUB:
        for name in ("INPUT0", "INPUT1"):
            inputs.append(draw(_tensor(name, "FP32", [16])))
        expected = {"OUTPUT0": 64, "OUTPUT1": 64}
    else:
        types = draw(st.permutations(DATATYPES))[:draw(st.integers(1, 5))]  # (each type as likely as the next)
        batch = draw(st.integers(1, MAX_BATCH))  # (batch 0 is outside what Triton serves: see the test)
        for dt in types:
            if model == IDENTITY:
                shape = [batch, draw(st.integers(0, 3)), draw(st.integers(0, 3))]
            else:
                shape = [draw(st.integers(0, 6))]
            inputs.append(draw(_tensor(f"INPUT_{dt}", dt, shape)))
        draw(st.randoms()).shuffle(inputs)
        expected = {"OUTPUT_" + t.datatype: len(t.wire()) for t in inputs}
    # outputs that must travel binary: FP16/BF16 (no JSON form) and BYTES that are not UTF-8 (see the test)
    binary_only = {"OUTPUT_" + t.datatype for t in inputs if t.datatype in NO_JSON or not t.utf8()}
    outputs: list[OutputSpec] | None = None
    binary_data_output = draw(st.sampled_from([None, True, False]))
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(sorted(expected)), min_size=1, unique=True))
        if model != ADD_SUB and draw(st.integers(0, 4)) == 0:  # an output whose input the request lacks
            names.append(draw(st.sampled_from([f"OUTPUT_{dt}" for dt in DATATYPES if f"OUTPUT_{dt}" not in expected])))
        outputs = []
        for name in names:
            shm = draw(st.integers(0, 3)) == 0 and expected.get(name, 8) > 0  # (no zero-byte region either)
            # `binary_data: true` with a region is an error (a test of its own)
            binary = draw(st.sampled_from([None, False] if shm else [None, True, False]))
            if name in binary_only and not shm and not binary:
                binary = True  # (`binary_data_output` does not reach a listed output)
            outputs.append(OutputSpec(name, binary, shm))
    elif binary_only and not binary_data_output:
        binary_data_output = True
    # (Triton cuts an id at its first NUL, a C string's end: see the test)
    id_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
    request_id = draw(st.one_of(st.none(), st.text(id_chars, max_size=8)))
    parameters = draw(st.dictionaries(_PARAM_KEYS, _PARAM_VALUES, max_size=3))
    return RequestSpec(model, inputs, outputs, request_id, parameters, binary_data_output,
                       ascii_json=draw(st.booleans()), shm_gap=draw(st.integers(0, 3)), expected=expected)


# ---------------------------------------------------------------- every datatype, each way (explicit examples)

_EDGES: dict[str, list[Any]] = {  # four values per datatype: extremes and specials
    "BOOL": [True, False, True, False],
    "FP16": [0x7C00, 0xFC00, 0x7E01, 0x8000],  # bits: inf, -inf, a NaN with a payload, -0
    "BF16": [0x7F80, 0xFF80, 0x7FC1, 0x0001],  # inf, -inf, a NaN with a payload, the smallest subnormal
    "FP32": [math.nan, -math.inf, 3.4028234663852886e38, 1e-45],
    "FP64": [math.nan, math.inf, -0.0, 5e-324],
}
_JSON_EDGES = {"FP64": [math.nan, math.inf, -0.0, 123456789012345e-22],  # (what rapidjson reads exactly)
               "BYTES": ["", "h\u00e9llo", "\u2603\U0001F600", "\x00tab\t\"\\"]}
_RAW_BYTES = [b"", b"\xff\xfe", b"\x00", "\u00e9".encode()]


def _edge_array(datatype: str, shape: list[int], json_safe: bool) -> np.ndarray:
    dt = NUMPY[datatype]
    if datatype == "BYTES":
        vals: list[Any] = [v.encode() for v in _JSON_EDGES["BYTES"]] if json_safe else _RAW_BYTES
        return np.array(vals, dtype=object).reshape(shape)
    if datatype in ("FP16", "BF16"):
        return np.array(_EDGES[datatype], dtype="<u2").view(dt).reshape(shape)
    if json_safe and datatype in _JSON_EDGES:
        return np.array(_JSON_EDGES[datatype], dtype=dt).reshape(shape)
    if datatype in _EDGES:
        return np.array(_EDGES[datatype], dtype=dt).reshape(shape)
    info = np.iinfo(dt)
    return np.array([info.min, info.max, 0, 1], dtype=dt).reshape(shape)


def every_datatype(model: str, encoding: str, outputs: str) -> RequestSpec:
    """One request with an input of each datatype (four values each) sent `encoding` ("json": those
    that have a JSON form; FP16 and BF16 go binary); outputs "default" (binary), "json", "binary", "shm"."""
    shape = [2, 1, 2] if model == IDENTITY else [4]
    inputs = []
    for dt in DATATYPES:
        enc = "binary" if encoding == "json" and dt in NO_JSON else encoding
        inputs.append(InputSpec(f"INPUT_{dt}", dt, shape, _edge_array(dt, shape, enc == "json"), enc))
    expected = {"OUTPUT_" + t.datatype: len(t.wire()) for t in inputs}
    outs = None
    if outputs != "default":
        outs = [OutputSpec(name, None if outputs == "shm" else outputs == "binary" or name[7:] in NO_JSON
                           or not inputs[i].utf8(), outputs == "shm") for i, name in enumerate(expected)]
    return RequestSpec(model, inputs, outs, "every-datatype", {"p": 1, "q": "x", "r": True, "s": 0.5},
                       True if outputs == "default" else None, ascii_json=encoding != "json", expected=expected)


def explicit_examples() -> list[RequestSpec]:
    """Run before the random draw, every time: each datatype each way, and add_sub with NaN and infinities."""
    add = [InputSpec("INPUT0", "FP32", [16], np.array([math.nan, math.inf, -math.inf, -0.0] * 4, "<f4"), "json"),
           InputSpec("INPUT1", "FP32", [16], np.array([1.5, -math.inf, 2.0, 0.0] * 4, "<f4"), "json")]
    return [every_datatype(IDENTITY_NOBATCH, "binary", "default"),
            every_datatype(IDENTITY, "json", "json"),
            every_datatype(IDENTITY_NOBATCH, "shm", "shm"),
            every_datatype(IDENTITY, "binary", "binary"),
            RequestSpec(ADD_SUB, add, [OutputSpec("OUTPUT0", False, False), OutputSpec("OUTPUT1", None, False)],
                        None, {}, None, expected={"OUTPUT0": 64, "OUTPUT1": 64})]


# ---------------------------------------------------------------- one thing wrong

MUTATIONS = ("datatype", "rank", "missing input", "batch too large", "unknown output", "unknown input")


@st.composite
def invalid_requests(draw: Any) -> tuple[str, RequestSpec]:
    """A valid request with one thing made wrong (the kind is returned with it)."""
    spec = draw(requests())
    kinds = ["rank", "unknown output", "unknown input"]
    if any(t.encoding != "json" and t.datatype != "BYTES" for t in spec.inputs):
        kinds.append("datatype")
    if spec.model == ADD_SUB:
        kinds.append("missing input")
    if spec.model == IDENTITY:
        kinds.append("batch too large")
    kind = draw(st.sampled_from(kinds))
    t = draw(st.sampled_from(spec.inputs))
    if kind == "datatype":  # the same bytes under another fixed-size type
        t = draw(st.sampled_from([x for x in spec.inputs if x.encoding != "json" and x.datatype != "BYTES"]))
        t.datatype = draw(st.sampled_from([d for d in DATATYPES if d not in (t.datatype, "BYTES")]))
    elif kind == "rank":
        t.shape = [*t.shape, 1]
        t.array = t.array.reshape(t.shape)
    elif kind == "missing input":
        spec.inputs.remove(t)
    elif kind == "batch too large":
        for x in spec.inputs:
            x.shape = [MAX_BATCH + 1, *x.shape[1:]]
            x.array = (np.full(x.shape, b"x", dtype=object) if x.datatype == "BYTES"
                       else np.zeros(x.shape, x.array.dtype))
    elif kind == "unknown output":
        spec.outputs = [*(spec.outputs or []), OutputSpec("OUTPUT_NOPE", None, False)]
    else:
        t.name = "INPUT_NOPE"
    spec.expected = {}  # (no output is expected; shm outputs get a placeholder size)
    return kind, spec
