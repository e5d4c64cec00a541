"""Regenerates the seed corpora of the worker-link fuzz targets from a real server's traffic.

    .venv/bin/python fuzz/seeds/wire_seeds.py

A real `inferd` (explicit model control) serves add_sub, string_reverse (BYTES) and identity (every
datatype) from examples/ and tests/fixtures/models. Once it is up, its worker endpoint is moved aside and a
recording proxy takes its place, so every worker socket started afterwards (each model's main socket,
spoken by inferd's own DealerSocket; the libzmq heartbeat sockets) goes through the proxy. The models are
loaded, tritonclient calls them over HTTP (JSON and binary) and gRPC, and they are unloaded. From what the
proxy saw, both ways:

- fuzz/corpus/zmtp_frames/: the start of each connection's byte stream (greeting, READY, the first
  messages; a few KiB), read whole and in small pieces;
- fuzz/corpus/wire_codec/: every distinct shape of header frame (by message type and keys);
- fuzz/corpus/wire_bytes/: the BYTES tensors the worker got.

Files are named by the sha1 of their content (first 16 hex digits); existing files are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"
MODELS = {"add_sub": ROOT / "examples" / "add_sub", "string_reverse": ROOT / "examples" / "string_reverse",
          "identity": ROOT / "tests" / "fixtures" / "models" / "identity"}
STREAM_SEED_MAX = 3000  # bytes of a connection kept as a zmtp_frames seed
HEADER_SEED_MAX = 4000

sys.path.insert(0, str(ROOT / "fuzz"))
import harness  # noqa: E402  (fuzz/harness.py: save_input)

# ---- the recording proxy --------------------------------------------------------------------------------

class Recorder:
    def __init__(self, path: str, upstream: str) -> None:
        self.streams: list[tuple[str, bytearray]] = []  # ("c2s" | "s2c", bytes)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.upstream = upstream
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            for direction, src, dst in (("c2s", client, server), ("s2c", server, client)):
                buf = bytearray()
                self.streams.append((direction, buf))
                threading.Thread(target=self._pump, args=(src, dst, buf), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, buf: bytearray) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                buf += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ---- the client (tritonclient; no inferd import in this process besides the worker's wire) ----------------

def _call(http_url: str, grpc_url: str) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    data = {
        "BOOL": np.array([True, False]), "INT8": np.array([-128, 127], np.int8), "INT16": np.array([-3], np.int16),
        "INT32": np.arange(3, dtype=np.int32), "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
        "UINT8": np.array([0, 255], np.uint8), "UINT16": np.array([65535], np.uint16),
        "UINT32": np.array([2**32 - 1], np.uint32), "UINT64": np.array([2**64 - 1], np.uint64),
        "FP16": np.array([0.5], np.float16), "FP32": np.array([1.5, float("nan")], np.float32),
        "FP64": np.array([-0.0], np.float64), "BYTES": np.array([b"", b"\x00\xff", "é".encode()], np.object_),
    }
    for module, url in ((httpclient, http_url), (grpcclient, grpc_url)):
        client = module.InferenceServerClient(url)
        for binary in ((True, False) if module is httpclient else (True,)):
            inputs = []
            for dt, arr in data.items():
                t = module.InferInput("INPUT_" + dt, list(arr.shape), dt)
                if module is httpclient:
                    t.set_data_from_numpy(arr, binary_data=binary or dt in ("FP16", "BYTES"))
                else:
                    t.set_data_from_numpy(arr)
                inputs.append(t)
            client.infer("identity", inputs, request_id="seed-identity")
        a = np.arange(16, dtype=np.float32)
        inputs = [module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a[::-1].copy())
        client.infer("add_sub", inputs)
        s = module.InferInput("INPUT0", [3], "BYTES")
        s.set_data_from_numpy(np.array([b"abc", "\u2603".encode(), b""], dtype=np.object_))
        client.infer("string_reverse", [s], parameters={"p": 1})


# ---- reading the recordings -----------------------------------------------------------------------------

def messages(stream: bytes) -> list[list[bytes]]:
    """The data messages of a ZMTP stream (a plain reading: the streams are a real server's)."""
    out, parts, pos = [], [], 64
    while len(stream) - pos >= 2:
        flags = stream[pos]
        if flags & 2:
            if len(stream) - pos < 9:
                break
            (size,) = struct.unpack_from(">Q", stream, pos + 1)
            pos += 9
        else:
            size = stream[pos + 1]
            pos += 2
        if pos + size > len(stream):
            break
        body, pos = stream[pos:pos + size], pos + size
        if flags & 4:
            continue
        parts.append(body)
        if not flags & 1:
            out.append(parts)
            parts = []
    return out


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", shape(value[0]) if value else None)
    return type(value).__name__


def byte_tensors(header: dict[str, Any], frames: list[bytes]) -> list[bytes]:
    out = []
    for item in header.get("requests", []):
        for ref in item.get("inputs", []):
            if ref.get("datatype") == "BYTES" and ref.get("loc", "frame") == "frame":
                frame = frames[ref["frame"]]
                out.append(frame[ref.get("offset", 0):ref.get("offset", 0) + ref.get("nbytes", len(frame))])
    return out


def keep(streams: list[tuple[str, bytearray]]) -> dict[str, int]:
    counts = {"zmtp_frames": 0, "wire_codec": 0, "wire_bytes": 0}
    seen: set[Any] = set()
    for direction, buf in streams:
        stream = bytes(buf)
        if len(stream) < 64:
            continue
        head = stream[:STREAM_SEED_MAX]
        for mode in (0, 2, 6):  # read whole; in reads of 1-3 bytes; of sizes from a list (zmtp_frames.cuts)
            harness.save_input(CORPUS / "zmtp_frames", bytes((mode,)) + head)
            counts["zmtp_frames"] += 1
        for msg in messages(stream):
            try:
                header = json.loads(msg[0])
            except ValueError:
                continue
            key = (direction, shape(header))
            if key not in seen and len(msg[0]) <= HEADER_SEED_MAX:
                seen.add(key)
                harness.save_input(CORPUS / "wire_codec", b"\x00" + msg[0])
                counts["wire_codec"] += 1
            for tensor in byte_tensors(header, msg[1:]):
                harness.save_input(CORPUS / "wire_bytes", b"\x00" + tensor)
                counts["wire_bytes"] += 1
    return counts


# ---- the server -----------------------------------------------------------------------------------------

def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _post(url: str, body: bytes = b"{}") -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=60) as r:
        r.read()


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="wire-seeds-"))
    repo, run_dir = work / "repo", work / "run"
    for name, src in MODELS.items():
        shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    http, grpc, metrics = _free_ports(3)
    inferd = Path(sys.executable).parent / "inferd"
    proc = subprocess.Popen([str(inferd), "--model-repository", str(repo), "--model-control-mode", "explicit",
                             "--run-dir", str(run_dir), "--http-port", str(http), "--grpc-port", str(grpc),
                             "--metrics-port", str(metrics)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/v2/health/live", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.1)
        real = str(run_dir / "workers.real.sock")
        os.rename(run_dir / "workers.sock", real)  # the listener keeps its socket; new workers reach the proxy
        recorder = Recorder(str(run_dir / "workers.sock"), real)
        for name in MODELS:
            _post(f"{base}/v2/repository/models/{name}/load")
        _call(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}")
        for name in MODELS:
            _post(f"{base}/v2/repository/models/{name}/unload")
        time.sleep(1.0)  # the workers' Bye and last heartbeats
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    counts = keep(recorder.streams)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{len(recorder.streams)} streams recorded; kept {counts}")


if __name__ == "__main__":
    main()
