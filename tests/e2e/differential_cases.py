"""Invalid (and a few odd but valid) requests for tests/e2e/test_differential_triton.py, each as exact HTTP
bytes and, where the protocol can say it, as a gRPC ModelInferRequest (tritonclient's protos). Both servers
must answer each with the same status; where Triton's status is a defect of Triton's the case is in
KNOWN_DIFFERENCES instead, with both statuses.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from differential import ADD_SUB, IDENTITY, IDENTITY_NOBATCH
from tritonclient.grpc import service_pb2 as pb

REGION = "errs"  # a 64-byte region both servers have registered (the test's fixture)
REGION_SIZE = 64


@dataclass
class Case:
    name: str
    model: str
    http: tuple[bytes, dict[str, str]] | None
    grpc: Any = None  # a ModelInferRequest
    version: str = ""


def _json(doc: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return json.dumps(doc).encode(), {"Content-Type": "application/json"}


def _binary(doc: dict[str, Any], blob: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(doc).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def _t(name: str, datatype: str, shape: list[int], data: list[Any] | None = None, **params: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        t["data"] = data
    if params:
        t["parameters"] = params
    return t


def _g(model: str, inputs: list[tuple[str, str, list[int], bytes | None, dict[str, Any]]],
       outputs: list[tuple[str, dict[str, Any]]] = (), contents: dict[str, list[Any]] | None = None,
       version: str = "") -> Any:
    """inputs: (name, datatype, shape, raw bytes or None, parameters); contents: name -> typed values."""
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape, raw, params in inputs:
        t = req.inputs.add(name=name, datatype=datatype, shape=shape)
        for k, v in params.items():
            if isinstance(v, str):
                t.parameters[k].string_param = v
            else:
                t.parameters[k].int64_param = v
        if raw is not None:
            req.raw_input_contents.append(raw)
        if contents and name in contents:
            field = "int_contents" if datatype.startswith("INT") else "fp32_contents"
            getattr(t.contents, field).extend(contents[name])
    for name, params in outputs:
        o = req.outputs.add(name=name)
        for k, v in params.items():
            if isinstance(v, str):
                o.parameters[k].string_param = v
            else:
                o.parameters[k].int64_param = v
    return req


F16 = [1.0] * 16
F16_RAW = struct.pack("<16f", *F16)
SHM_IN = {"shared_memory_region": REGION, "shared_memory_byte_size": 4}


def cases() -> list[Case]:
    nb, ident = IDENTITY_NOBATCH, IDENTITY
    return [
        Case("wrong datatype", nb, _json({"inputs": [_t("INPUT_FP32", "FP64", [1], [1.5])]}),
             _g(nb, [("INPUT_FP32", "FP64", [1], b"\0" * 8, {})])),
        Case("wrong rank, batching model", ident, _json({"inputs": [_t("INPUT_INT8", "INT8", [1, 2], [1, 2])]}),
             _g(ident, [("INPUT_INT8", "INT8", [1, 2], b"\1\2", {})])),
        Case("wrong fixed dim", ADD_SUB, _json({"inputs": [_t("INPUT0", "FP32", [15], F16[:15]),
                                                           _t("INPUT1", "FP32", [16], F16)]}),
             _g(ADD_SUB, [("INPUT0", "FP32", [15], F16_RAW[:60], {}), ("INPUT1", "FP32", [16], F16_RAW, {})])),
        Case("missing input", ADD_SUB, _json({"inputs": [_t("INPUT0", "FP32", [16], F16)]}),
             _g(ADD_SUB, [("INPUT0", "FP32", [16], F16_RAW, {})])),
        Case("unknown input", nb, _json({"inputs": [_t("INPUT_NOPE", "INT8", [1], [1])]}),
             _g(nb, [("INPUT_NOPE", "INT8", [1], b"\1", {})])),
        Case("input given twice", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])] * 2}),
             _g(nb, [("INPUT_INT8", "INT8", [1], b"\1", {})] * 2)),
        Case("byte size vs shape", nb, _binary({"inputs": [_t("INPUT_FP32", "FP32", [1], binary_data_size=8)]},
                                               b"\0" * 8),
             _g(nb, [("INPUT_FP32", "FP32", [1], b"\0" * 8, {})])),
        Case("binary body shorter than declared", nb,
             _binary({"inputs": [_t("INPUT_FP32", "FP32", [2], binary_data_size=8)]}, b"\0" * 4)),
        Case("bytes after the last input", nb,
             _binary({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])]}, b"\0\0")),
        Case("BYTES element overruns", nb,
             _binary({"inputs": [_t("INPUT_BYTES", "BYTES", [1], binary_data_size=6)]}, b"\x09\0\0\0ab"),
             _g(nb, [("INPUT_BYTES", "BYTES", [1], b"\x09\0\0\0ab", {})])),
        Case("batch above max_batch_size", ident, _json({"inputs": [_t("INPUT_INT8", "INT8", [5, 1, 1], [1] * 5)]}),
             _g(ident, [("INPUT_INT8", "INT8", [5, 1, 1], b"\1" * 5, {})])),
        Case("batch sizes differ", ident, _json({"inputs": [_t("INPUT_INT8", "INT8", [2, 1, 1], [1, 2]),
                                                            _t("INPUT_UINT8", "UINT8", [1, 1, 1], [3])]}),
             _g(ident, [("INPUT_INT8", "INT8", [2, 1, 1], b"\1\2", {}),
                        ("INPUT_UINT8", "UINT8", [1, 1, 1], b"\3", {})])),
        Case("FP16 as JSON", nb, _json({"inputs": [_t("INPUT_FP16", "FP16", [1], [1.0])]})),
        Case("BF16 as JSON", nb, _json({"inputs": [_t("INPUT_BF16", "BF16", [1], [1.0])]})),
        Case("FP16 output as JSON", nb,
             _binary({"inputs": [_t("INPUT_FP16", "FP16", [1], binary_data_size=2)],
                      "outputs": [{"name": "OUTPUT_FP16", "parameters": {"binary_data": False}}]}, b"\0\x3c")),
        Case("FP16 output as JSON by default", nb,
             _binary({"inputs": [_t("INPUT_FP16", "FP16", [1], binary_data_size=2)]}, b"\0\x3c")),
        Case("unknown output", nb,
             _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])], "outputs": [{"name": "NOPE"}]}),
             _g(nb, [("INPUT_INT8", "INT8", [1], b"\1", {})], [("NOPE", {})])),
        Case("output of an input not sent", nb,
             _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])], "outputs": [{"name": "OUTPUT_INT16"}]}),
             _g(nb, [("INPUT_INT8", "INT8", [1], b"\1", {})], [("OUTPUT_INT16", {})])),
        Case("reserved parameter", nb,
             _json({"parameters": {"triton_x": 1}, "inputs": [_t("INPUT_INT8", "INT8", [1], [1])]})),
        Case("parameter of an object", nb,
             _json({"parameters": {"p": {"a": 1}}, "inputs": [_t("INPUT_INT8", "INT8", [1], [1])]})),
        Case("sequence parameters to a model without sequence batching", nb,
             _json({"parameters": {"sequence_id": 5, "sequence_start": True, "priority": 3, "timeout": 100000},
                    "inputs": [_t("INPUT_INT8", "INT8", [1], [1])]})),
        Case("nested JSON data", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [3], [[1, 2], [3]])]})),
        Case("classification", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [3], [1, 3, 2])],
                                          "outputs": [{"name": "OUTPUT_INT8", "parameters": {"classification": 2}}]}),
             _g(nb, [("INPUT_INT8", "INT8", [3], b"\1\3\2", {})], [("OUTPUT_INT8", {"classification": 2})])),
        Case("classification of BOOL", nb,
             _json({"inputs": [_t("INPUT_BOOL", "BOOL", [2], [True, False])],
                    "outputs": [{"name": "OUTPUT_BOOL", "parameters": {"classification": 1}}]})),
        Case("binary_data true with a shm output", nb,
             _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])],
                    "outputs": [{"name": "OUTPUT_INT8", "parameters": {
                        "binary_data": True, "shared_memory_region": REGION, "shared_memory_byte_size": 1}}]})),
        Case("data and a shm region both", nb,
             _json({"inputs": [_t("INPUT_FP32", "FP32", [1], [1.0], **SHM_IN)]})),
        Case("unregistered region", nb,
             _json({"inputs": [_t("INPUT_FP32", "FP32", [1], shared_memory_region="nope", shared_memory_byte_size=4)]}),
             _g(nb, [("INPUT_FP32", "FP32", [1], None,
                      {"shared_memory_region": "nope", "shared_memory_byte_size": 4})])),
        Case("shm beyond the region", nb,
             _json({"inputs": [_t("INPUT_FP32", "FP32", [1], **SHM_IN, shared_memory_offset=REGION_SIZE - 2)]}),
             _g(nb, [("INPUT_FP32", "FP32", [1], None, {**SHM_IN, "shared_memory_offset": REGION_SIZE - 2})])),
        Case("shm size vs shape", nb,
             _json({"inputs": [_t("INPUT_FP32", "FP32", [2], **SHM_IN)]}),
             _g(nb, [("INPUT_FP32", "FP32", [2], None, SHM_IN)])),
        Case("unknown model", "nope", _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])]}),
             _g("nope", [("INPUT_INT8", "INT8", [1], b"\1", {})])),
        Case("unknown version", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [1])]}),
             _g(nb, [("INPUT_INT8", "INT8", [1], b"\1", {})], version="7"), version="7"),
        Case("raw and typed contents mixed", nb, None,
             _g(nb, [("INPUT_INT8", "INT8", [1], b"\1", {}), ("INPUT_INT16", "INT16", [1], None, {})],
                contents={"INPUT_INT16": [5]})),
        Case("fewer raw contents than inputs", nb, None,
             _g(nb, [("INPUT_INT8", "INT8", [1], b"\1", {}), ("INPUT_INT16", "INT16", [1], None, {})])),
        Case("typed contents count vs shape", nb, None,
             _g(nb, [("INPUT_INT32", "INT32", [3], None, {})], contents={"INPUT_INT32": [1, 2]})),
    ]


# Where Triton 2.51's answer is a defect of its own: (name, model, HTTP request, inferd's status, Triton's).
# Triton answers 500 for JSON whose fields have the wrong type or count (its parse errors are not mapped to
# 400); inferd answers 400 naming the field.
def known_differences() -> list[tuple[str, str, tuple[bytes, dict[str, str]], int, int]]:
    nb = IDENTITY_NOBATCH
    return [
        ("a JSON number for a BYTES element", nb, _json({"inputs": [_t("INPUT_BYTES", "BYTES", [1], [5])]}), 400, 500),
        ("a float for an INT32 element", nb, _json({"inputs": [_t("INPUT_INT32", "INT32", [1], [1.0])]}), 400, 500),
        ("1 for a BOOL element", nb, _json({"inputs": [_t("INPUT_BOOL", "BOOL", [1], [1])]}), 400, 500),
        ("a number as the id", nb, _json({"id": 5, "inputs": [_t("INPUT_INT8", "INT8", [1], [1])]}), 400, 500),
        ("a negative dimension", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [-1], [1])]}), 400, 500),
        ("fewer JSON values than the shape", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [3], [1, 2])]}), 400, 500),
        # Triton wraps an integer out of its datatype's range (300 -> 44 for INT8)
        ("300 for an INT8 element", nb, _json({"inputs": [_t("INPUT_INT8", "INT8", [1], [300])]}), 400, 200),
        # Triton's Python backend reads input 0 to find the batch size of a batching model
        ("no input to a batching model", IDENTITY, _json({"inputs": []}), 200, 400),
        # Triton writes the raw bytes into the JSON string: an answer that is not UTF-8 (its client fails on it)
        ("non-UTF-8 BYTES asked for as JSON", nb,
         _binary({"inputs": [_t("INPUT_BYTES", "BYTES", [1], binary_data_size=6)],
                  "outputs": [{"name": "OUTPUT_BYTES", "parameters": {"binary_data": False}}]}, b"\2\0\0\0\xff\xfe"),
         400, 200),
        ("a lone surrogate in a JSON string", nb,
         _json({"id": "\ud800", "inputs": [_t("INPUT_INT8", "INT8", [1], [1])]}), 400, 500),
        # Triton reads a batch of 0 as no batch dimension: [0, 2] with 8 bytes is answered as shape [2]
        # (and a [0, 0] request hangs its HTTP frontend, so it is not sent)
        ("batch size 0", IDENTITY, _binary({"inputs": [_t("INPUT_FP32", "FP32", [0, 1, 2], binary_data_size=8)]},
                                           b"\0" * 8), 400, 200),
        # a shared-memory output region too small for the output: a client error, which Triton answers with 500
        ("a shm output region too small", nb,
         _json({"inputs": [_t("INPUT_FP32", "FP32", [2], [1.0, 2.0])], "outputs": [{"name": "OUTPUT_FP32",
                "parameters": {"shared_memory_region": REGION, "shared_memory_byte_size": 4}}]}), 400, 500),
        # Triton computes offset + size - 1 in unsigned arithmetic: a zero-byte tensor at offset 0 "overflows"
        ("a zero-byte tensor in shared memory", nb,
         _json({"inputs": [_t("INPUT_FP32", "FP32", [0], shared_memory_region=REGION, shared_memory_byte_size=0)]}),
         200, 400),
    ]
