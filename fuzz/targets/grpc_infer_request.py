"""ModelInferRequest bytes -> inferd's gRPC request reader, differential against protobuf.

The invariant is what the server ends up reading: `wire.decode_request` (the hand-written fast parser,
falling back to protobuf for anything it does not take) must give exactly the values protobuf's own
ParseFromString gives (our generated module, supervisor/_gen), or BAD where protobuf refuses the bytes.
Checked for bytes and for a bytearray (a message spread over several DATA frames), twice each (the second
read shares the cached parse of the message's head), and the fast parser alone must never accept what
protobuf refuses or read it differently. Then `convert.to_core` runs on both readings: it must raise only
InferdError (a client error), and the same one, or build the same request.

Data: the serialized message itself (seeds: what tritonclient.grpc sends, fuzz/seeds/grpc_seeds.py).
"""

from __future__ import annotations

import struct
from typing import Any

from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.supervisor.grpc_api import convert, wire
from inferd.worker.wire.errors import InferdError, invalid_arg

_DOUBLE = struct.Struct("<d")
_from_string = pb.ModelInferRequest.FromString
SHM_LIMIT = 1 << 20  # the stub region below serves reads up to this size


def _param(p: tuple[str | None, Any]) -> tuple[Any, ...]:
    which, value = p
    if which == "double_param":  # by bits: NaN != NaN, and -0.0 must stay -0.0
        return which, _DOUBLE.pack(value)
    return which, type(value).__name__, value


def _params(params: dict[str, Any]) -> dict[str, Any]:
    return {k: _param(p) for k, p in params.items()}


def canonical(r: convert.ParsedRequest) -> tuple[Any, ...]:
    """Everything a ParsedRequest says, in a form == compares exactly."""
    return (
        r.model_name,
        r.model_version,
        r.id,
        _params(r.parameters),
        [
            (t.name, t.datatype, list(t.shape), _params(t.parameters),
             None if t.contents is None else t.contents.SerializeToString(deterministic=True))
            for t in r.inputs
        ],
        [(o.name, _params(o.parameters)) for o in r.outputs],
        [bytes(x) for x in r.raw],
    )


class _StubPlane:
    """Shared memory reads answer zeros of the asked size (bounded); no region is a CUDA one."""

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> bytes:
        if byte_size > SHM_LIMIT:
            raise invalid_arg(f"stub region '{region}' is smaller than {byte_size} bytes")
        return bytes(byte_size)

    def shm_is_cuda(self, region: str) -> bool:
        return False

    def shm_check(self, region: str, offset: int, byte_size: int) -> None:
        if offset < 0 or byte_size < 0:  # (read unsigned, as Triton reads them: out of any region's bounds)
            raise invalid_arg(f"Invalid offset for shared memory region: '{region}'")

    def shm_hold(self, names: Any) -> None:
        return None


_PLANE: Any = _StubPlane()


def _core(parsed: convert.ParsedRequest) -> tuple[Any, ...]:
    """What to_core builds (or the code of the client error it raises), comparable. Not the error's text:
    with several bad parameters it names the first one met, and protobuf's maps iterate in no set order."""
    try:
        req, shm = convert.to_core(parsed, _PLANE)
    except InferdError as exc:
        return ("error", exc.code)
    return (
        req.model_name, req.model_version, req.id,
        [(t.name, t.datatype, t.shape, bytes(t.data), t.parameters) for t in req.inputs],
        [(o.name, o.parameters) for o in req.outputs],
        req.parameters, req.correlation_id, req.flags, req.priority, req.timeout_us, shm, req.device_outputs,
    )


def test_one_input(data: bytes) -> None:
    try:
        want: convert.ParsedRequest | None = convert.from_message(_from_string(data))
    except Exception:  # DecodeError, RecursionError: the request is refused
        want = None
    expected = None if want is None else canonical(want)

    fast = wire.parse_request(data)
    if fast is not None:
        assert want is not None, "the fast parser accepted bytes protobuf refuses"
        assert canonical(fast) == expected, f"fast parser read {canonical(fast)!r}, protobuf {expected!r}"

    for form in (data, bytearray(data)):
        for _ in range(2):  # the second read of the same bytes comes from the head cache
            got = wire.decode_request(form)
            if want is None:
                assert got is convert.BAD, f"decode_request accepted what protobuf refuses: {got!r}"
                continue
            assert isinstance(got, convert.ParsedRequest), "decode_request refused what protobuf accepts"
            assert canonical(got) == expected, f"server read {canonical(got)!r}, protobuf {expected!r}"
            assert _core(got) == _core(want), "to_core built different requests from equal readings"
