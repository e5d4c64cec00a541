"""core.validate remembers (input, datatype, shape) that passed; a remembered tensor is still checked for
its bytes and batch size, and every request gets the answer a fresh check gives."""

from __future__ import annotations

import struct
from typing import Any

from inferd.supervisor.core.validate import IOSpec, validate_request
from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor
from inferd.worker.wire.errors import InferdError

CONFIG: dict[str, Any] = {
    "name": "m", "max_batch_size": 8,
    "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
              {"name": "B", "data_type": "TYPE_FP32", "dims": [-1]},
              {"name": "S", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
              {"name": "O", "data_type": "TYPE_FP32", "dims": [2], "optional": True}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
}


def _f(n: int) -> bytes:
    return bytes(4 * n)


def _s(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _req(*tensors: tuple[str, str, list[Any], bytes], outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest("m", "", "r1", [Tensor(n, d, list(s), b) for n, d, s, b in tensors],
                        [RequestedOutput(o) for o in outputs])


REQUESTS = [
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3))),  # seen: the same answer
    _req(("A", "FP32", [1, 4], _f(5)), ("B", "FP32", [1, 3], _f(3))),  # seen shape, wrong bytes
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(2))),
    _req(("A", "FP32", [2, 4], _f(8)), ("B", "FP32", [1, 3], _f(3))),  # batch sizes differ
    _req(("A", "FP32", [2, 4], _f(8)), ("B", "FP32", [2, 3], _f(6))),
    _req(("B", "FP32", [2, 3], _f(6)), ("A", "FP32", [1, 4], _f(4))),  # seen both, batch differs
    _req(("A", "FP32", [9, 4], _f(36)), ("B", "FP32", [9, 1], _f(9))),  # over max_batch_size
    _req(("A", "FP32", [9, 4], _f(36)), ("B", "FP32", [9, 1], _f(9))),
    _req(("A", "FP32", [1, 4], _f(4)), ("A", "FP32", [1, 4], _f(4))),  # twice
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("A", "FP32", [1, 4], _f(4))),
    _req(("A", "FP32", [1, 4], _f(4))),  # B missing
    _req(("A", "INT32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3))),
    _req(("A", "FP32", [1, 5], _f(5)), ("B", "FP32", [1, 3], _f(3))),
    _req(("A", "FP32", [1.0, 4], _f(4)), ("B", "FP32", [True, 3], _f(3))),  # equal as keys to ints
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, -3], _f(3))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("S", "BYTES", [1, 1], _s(b"ab"))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("S", "BYTES", [1, 1], _s(b"ab", b"c"))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("S", "BYTES", [1, 1], b"\x09\x00")),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("X", "FP32", [1, 1], _f(1))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), outputs=("OUT",)),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), outputs=("NOPE",)),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), outputs=("OUT", "OUT")),
    # every tensor below seen before: an optional input in place of a required one, repeats, batch sizes
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("O", "FP32", [1, 2], _f(2))),
    _req(("A", "FP32", [1, 4], _f(4)), ("O", "FP32", [1, 2], _f(2))),
    _req(("O", "FP32", [1, 2], _f(2)), ("A", "FP32", [1, 4], _f(4)), ("O", "FP32", [1, 2], _f(2))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("B", "FP32", [1, 3], _f(3))),
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), ("O", "FP32", [2, 2], _f(4))),
    _req(("A", "FP32", [9, 4], _f(36)), ("B", "FP32", [9, 1], _f(9)), ("O", "FP32", [9, 2], _f(18))),
    _req(("A", "FP32", [1, 4], bytearray(_f(4))), ("B", "FP32", [1, 3], memoryview(_f(3)))),
    _req(("A", "FP32", [1, 4], bytearray(_f(5))), ("B", "FP32", [1, 3], _f(3))),
    # views of a body (binary requests): counted in bytes, whatever their format
    _req(("A", "FP32", [1, 4], memoryview(_f(4))), ("B", "FP32", [1, 3], memoryview(_f(9))[4:16])),
    _req(("A", "FP32", [1, 4], memoryview(_f(5))), ("B", "FP32", [1, 3], memoryview(_f(3)))),
    _req(("A", "FP32", [1, 4], memoryview(_f(4))), ("B", "FP32", [1, 3], memoryview(_f(4))[:8])),
    _req(("A", "FP32", [1, 4], memoryview(_f(4)).cast("f")), ("B", "FP32", [1, 3], memoryview(_f(3)).cast("i"))),
    _req(("A", "FP32", [1, 4], memoryview(_f(2)).cast("d")), ("B", "FP32", [1, 3], memoryview(_f(3)))),
    _req(("A", "FP32", [1, 4], memoryview(_f(16)).cast("i")), ("B", "FP32", [1, 3], memoryview(_f(3)))),  # 16 items
    _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, 3], _f(3)), outputs=("OUT", "NOPE")),
]


def _outcome(spec: IOSpec, req: InferRequest) -> str:
    try:
        validate_request(spec, req)
    except InferdError as exc:
        return exc.message
    return "ok"


def test_every_request_gets_a_fresh_checks_answer() -> None:
    shared = IOSpec.from_config(CONFIG)
    for _ in range(2):  # the second time round every passing tensor is remembered
        for req in REQUESTS:
            assert _outcome(shared, req) == _outcome(IOSpec.from_config(CONFIG), req)
    assert shared.passed


def test_what_is_remembered_is_bounded() -> None:
    spec = IOSpec.from_config(CONFIG)
    for n in range(1, 1000):
        assert _outcome(spec, _req(("A", "FP32", [1, 4], _f(4)), ("B", "FP32", [1, n], _f(n)))) == "ok"
    assert len(spec.passed) <= 256
