"""Bytes after the client preface -> inferd's HTTP/2 server connection (grpc_api/http2: the frame reader,
HPACK decoding, streams, flow control, flood limits, gRPC message framing) with gRPC methods that run the
real request path (fuzz/targets/_h2server.py).

Checks, for arbitrary bytes: nothing but the connection's own refusals (GOAWAY, RST_STREAM, gRPC statuses)
comes of them; no exception escapes data_received, a callback or a task, and nothing is logged as an
error; what the connection keeps between reads stays within its caps (held frame bytes, header block, HPACK
table and block cache, streams, unfinished messages, queued output). Differential against itself: the
same bytes cut into other reads (down to single bytes, across the preface too) must make the server write
exactly the same bytes and close the same way. (The HPACK decoder against the `hpack` package:
fuzz/targets/http2_hpack.py; whole conversations with the `h2` client: http2_h2_client.py.)

Seeds: whole client connections of tritonclient.grpc (fuzz/seeds/grpc_seeds.py).
"""

from __future__ import annotations

import random
import zlib

from _h2server import preface, serve

MAX_LEN = 8192
SIZES = (1, 2, 3, 5, 8, 9, 10, 13, 17, 24, 64, 200, 4096)
DICT = [
    b"\x00\x00\x00\x04\x00\x00\x00\x00\x00",  # empty SETTINGS
    b"\x00\x00\x00\x04\x01\x00\x00\x00\x00",  # SETTINGS ACK
    b"\x00\x00\x08\x06\x00\x00\x00\x00\x00",  # PING head
    b"\x00\x00\x04\x08\x00\x00\x00\x00\x00",  # WINDOW_UPDATE head
    b"\x00\x00\x04\x03\x00\x00\x00\x00\x01",  # RST_STREAM on stream 1
    b"\x01\x04\x00\x00\x00\x01",  # HEADERS, END_HEADERS, stream 1 (after a length)
    b"\x01\x05\x00\x00\x00\x03",  # HEADERS, END_STREAM|END_HEADERS, stream 3
    b"\x00\x01\x00\x00\x00\x01",  # DATA, END_STREAM, stream 1
    b"\x09\x04\x00\x00\x00\x01",  # CONTINUATION, END_HEADERS
    b"\x83\x86",  # :method POST, :scheme http
    b"\x44\x2b/inference.GRPCInferenceService/ModelInfer",
    b"\x04\x31/inference.GRPCInferenceService/ModelStreamInfer",
    b"\x04\x2b/inference.GRPCInferenceService/ServerLive",
    b"\x5f\x10application/grpc",
    b"\x40\x02te\x08trailers",
    b"\x40\x0cgrpc-timeout\x021S",
    b"\x40\x0dgrpc-encoding\x04gzip",
    b"\x3f\xe1\x1f",  # dynamic table size update to 4096
    b"\x00\x00\x00\x00\x00",  # an empty gRPC message
]


def reads_of(data: bytes) -> list[bytes]:
    """The preface and `data` cut into reads of sizes chosen from the bytes themselves (the same every time)."""
    stream = preface() + data
    rng = random.Random(zlib.crc32(data))
    out = []
    pos = 0
    while pos < len(stream):
        n = rng.choice(SIZES)
        out.append(stream[pos : pos + n])
        pos += n
    return out


def test_one_input(data: bytes) -> None:
    whole = serve([preface() + data])
    assert not whole.failures, "\n".join(whole.failures)
    cut = serve(reads_of(data))
    assert not cut.failures, "\n".join(cut.failures)
    assert cut.closed == whole.closed, f"closed {cut.closed!r} when cut into reads, {whole.closed!r} when whole"
    assert cut.out == whole.out, (
        f"the server wrote other bytes when the input came in other reads: {len(cut.out)} vs {len(whole.out)}; "
        f"first difference at {next((i for i, (a, b) in enumerate(zip(cut.out, whole.out)) if a != b), None)}"
    )
