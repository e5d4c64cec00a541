"""Regenerates the seed corpora of the gRPC and HTTP/2 fuzz targets from real client traffic.

    .venv/bin/python fuzz/seeds/grpc_seeds.py

An unmodified tritonclient.grpc client (in a child process: tritonclient.grpc and inferd's generated
protobuf modules must not share a process, both register the same names in protobuf's default pool)
calls a capturing server: inferd's own HTTP/2 connection (grpc_api/http2) with a stub application that
answers every call with an empty response. What the client wrote is kept as sent:

- fuzz/corpus/grpc_infer_request/: every ModelInferRequest message (ModelInfer and ModelStreamInfer),
  one per file: every datatype, BYTES, request and tensor parameters, sequences, priority, timeout,
  shared-memory inputs and outputs, classification.
- fuzz/corpus/http2_frames/: the bytes of each small client connection after the 24-byte preface
  (SETTINGS, WINDOW_UPDATE, HEADERS, DATA, PING as grpc-core sends them).

Files are named by the sha1 of their content (first 16 hex digits); existing files are left alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"
MAX_CONNECTION_SEED = 8192  # longer connections give request seeds only
SERVICE = "/inference.GRPCInferenceService/"


# ---------------------------------------------------------------------------------------------
# the client (child process: imports tritonclient only)


def _client(url: str) -> None:
    import ml_dtypes
    import numpy as np
    import tritonclient.grpc as grpcclient

    def client() -> Any:
        # a subchannel pool of its own: every client is a connection of its own
        return grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])

    def tensor(name: str, datatype: str, array: Any) -> Any:
        t = grpcclient.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        return t

    numeric = {
        "BOOL": np.array([True, False, True]),
        "INT8": np.array([-128, 0, 127], dtype=np.int8),
        "INT16": np.array([-300, 1, 300], dtype=np.int16),
        "INT32": np.arange(-2, 4, dtype=np.int32).reshape(2, 3),
        "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "UINT8": np.array([0, 255], dtype=np.uint8),
        "UINT16": np.array([65535], dtype=np.uint16),
        "UINT32": np.array([1, 2**32 - 1], dtype=np.uint32),
        "UINT64": np.array([2**64 - 1], dtype=np.uint64),
        "FP16": np.array([0.5, -2.0], dtype=np.float16),
        "FP32": np.array([[1.5], [float("nan")]], dtype=np.float32),
        "FP64": np.array([1e300, -0.0], dtype=np.float64),
        "BF16": np.array([1.0, -3.0], dtype=ml_dtypes.bfloat16),
    }

    # one small connection per HTTP/2 seed: a plain unary infer, a stream of two, health and metadata-free calls
    with client() as c:
        c.infer("m", [tensor("INPUT0", "FP32", np.arange(4, dtype=np.float32))])
    with client() as c:
        results: list[Any] = []
        c.start_stream(lambda result, error: results.append((result, error)))
        c.async_stream_infer("m", [tensor("INPUT0", "INT32", np.arange(3, dtype=np.int32))], request_id="a")
        c.async_stream_infer("m", [tensor("INPUT0", "BYTES", np.array([b"x", b"yz"], dtype=np.object_))],
                             enable_empty_final_response=True)
        c.stop_stream()
    with client() as c:
        c.is_server_live()
        c.infer("m", [tensor("T", "UINT8", np.arange(200, dtype=np.uint8))], headers={"x-trace": "abc"},
                client_timeout=30.0, request_id="r-1")

    # the request seeds: one connection, every feature
    with client() as c:
        for datatype, array in numeric.items():
            c.infer("m", [tensor("X", datatype, array)])
        strings = np.array([["a", "bc"], ["", "déf"]], dtype=np.object_)
        c.infer("m", [tensor("S", "BYTES", strings)], outputs=[grpcclient.InferRequestedOutput("OUT")])
        c.infer("m", [tensor("S", "BYTES", np.array([b"\x00\xff", b""], dtype=np.object_))])
        c.infer("m", [tensor("E", "FP32", np.zeros((0, 3), dtype=np.float32))], model_version="2")
        c.infer("m", [tensor("A", "INT64", np.arange(2, dtype=np.int64)), tensor("B", "BOOL", np.array([True]))],
                outputs=[grpcclient.InferRequestedOutput("C", class_count=3), grpcclient.InferRequestedOutput("D")])
        c.infer("seq", [tensor("X", "INT32", np.array([1], dtype=np.int32))], sequence_id=42, sequence_start=True)
        c.infer("seq", [tensor("X", "INT32", np.array([1], dtype=np.int32))], sequence_id="corr-7", sequence_end=True)
        c.infer("m", [tensor("X", "FP32", np.ones(2, dtype=np.float32))], priority=3, timeout=1500,
                parameters={"s": "text", "b": True, "i": -5, "f": 0.25})
        shm_in = grpcclient.InferInput("X", [4], "FP32")
        shm_in.set_shared_memory("input_region", 16)
        shm_in2 = grpcclient.InferInput("Y", [2], "INT64")
        shm_in2.set_shared_memory("input_region", 16, offset=16)
        shm_out = grpcclient.InferRequestedOutput("Z")
        shm_out.set_shared_memory("output_region", 16, offset=32)
        c.infer("m", [shm_in, shm_in2], outputs=[shm_out])
        big = np.arange(300, dtype=np.float32)  # multi-byte lengths
        c.infer("a_model_with_a_rather_long_name_" + "x" * 100, [tensor("INPUT_" + "n" * 130, "FP32", big)])


# ---------------------------------------------------------------------------------------------
# the capturing server (this process)


class _Call:
    """One stream: collects the request messages, answers once the client has sent them all."""

    def __init__(self, app: _App, conn: Any, sid: int, path: str) -> None:
        from inferd.supervisor.grpc_api.http2.grpc_wire import Deframer

        self.app, self.conn, self.sid, self.path = app, conn, sid, path
        self.deframer = Deframer(1 << 30, None)
        self.messages: list[bytes] = []

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        from inferd.supervisor.grpc_api.http2.grpc_wire import RESPONSE_HEAD, TRAILERS_OK, frame_message

        self.messages += [bytes(m) for m in self.deframer.feed(payload)]
        self.conn.acknowledge(self.sid, len(payload))
        if not end_stream:
            return
        method = self.path.rsplit("/", 1)[-1]
        if method in ("ModelInfer", "ModelStreamInfer"):
            self.app.requests += self.messages
        # empty answers: ServerLiveResponse{live}, ModelInferResponse{}, ModelStreamInferResponse{infer_response{}}
        answer = {"ServerLive": b"\x08\x01", "ModelStreamInfer": b"\x12\x00"}.get(method, b"")
        pieces: list[Any] = []
        for _ in self.messages if method == "ModelStreamInfer" else [None]:
            pieces += frame_message(answer)
        self.conn.respond(self.sid, RESPONSE_HEAD, [b"".join(pieces)], sum(map(len, pieces)), TRAILERS_OK)

    def on_reset(self) -> None:
        pass


class _App:
    def __init__(self) -> None:
        self.requests: list[bytes] = []

    def open_stream(self, conn: Any, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> _Call:
        return _Call(self, conn, stream_id, dict(headers).get(":path", ""))

    def connection_made(self, conn: Any) -> None:
        pass

    def connection_lost(self, conn: Any) -> None:
        pass


def _capture() -> tuple[list[bytes], list[bytes]]:
    """(request messages, each connection's bytes after the preface) of one run of the client."""
    from inferd.supervisor.grpc_api.http2 import frames
    from inferd.supervisor.grpc_api.http2.abuse import PingPolicy
    from inferd.supervisor.grpc_api.http2.connection import H2Connection

    app = _App()
    streams: list[bytearray] = []

    class Capturing(H2Connection):
        def __init__(self) -> None:
            super().__init__(app, pings=PingPolicy(max_strikes=0))
            self.seen = bytearray()
            streams.append(self.seen)

        def data_received(self, data: bytes) -> None:
            self.seen += data
            super().data_received(data)

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(Capturing, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        subprocess.run([sys.executable, __file__, "--client", f"127.0.0.1:{port}"], check=True, timeout=300)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    connections = []
    for seen in streams:
        assert seen.startswith(frames.PREFACE), "a client connection without the HTTP/2 preface"
        connections.append(bytes(seen[len(frames.PREFACE) :]))
    return app.requests, connections


def _write(target: str, data: bytes) -> bool:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / hashlib.sha1(data).hexdigest()[:16]
    if path.exists():
        return False
    path.write_bytes(data)
    return True


def main() -> None:
    from inferd.supervisor._gen import grpc_service_pb2 as pb

    requests, connections = _capture()
    for data in requests:
        pb.ModelInferRequest.FromString(data)  # what the client sent is a valid request
    new = {
        "grpc_infer_request": sum(_write("grpc_infer_request", r) for r in requests),
        "http2_frames": sum(_write("http2_frames", c) for c in connections if len(c) <= MAX_CONNECTION_SEED),
    }
    print(json.dumps({"requests": len(requests), "connections": [len(c) for c in connections], "new_files": new}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        _client(sys.argv[2])
    else:
        main()
