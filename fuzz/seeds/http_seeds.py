#!/usr/bin/env python3
"""Seed corpora for the HTTP targets (http1_request, json_request, binary_tensors) from real traffic.

Starts a real inferd server as the tests do (tests/conftest.py's ServerFactory, fixture models), puts a small
recording TCP proxy in front of its HTTP port, and runs unmodified tritonclient.http through it: every
datatype (BOOL, INT8..INT64, UINT8..UINT64, FP16, FP32, FP64, BF16, BYTES) in JSON and binary encodings,
request parameters, system shared memory, classification, gzip bodies, async requests, the metadata and
statistics calls, plus a raw binary request (Inference-Header-Content-Length: 0) and generate. perf_analyzer
joins in when the tritonclient install ships one (.venv/bin/perf_analyzer). Then the adversarial framing
cases (request smuggling shapes, Upgrade, CONNECT, trailers, Expect, pipelining; see ADVERSARIAL).

What the client sent becomes, per target: http1_request, each request alone and the first requests of each
connection together (with the target's two option bytes in front); json_request, each JSON infer body;
binary_tensors, each binary infer request as `<model> <header length>\\n<body>`. Candidates are deduplicated
and, with atheris, only those that add coverage to the kept corpus are added (libFuzzer -merge=1); nothing
kept is removed (the kept corpus holds the regressions). The adversarial streams are also kept as they are
with small caps and http1_request's memory check on.

    .venv/bin/python fuzz/seeds/http_seeds.py [--dry-run]
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "fuzz"), str(ROOT / "fuzz" / "targets"), str(ROOT / "tests")]
import harness  # noqa: E402

MODELS = ["identity", "identity_bf16", "identity_fp32", "classify", "gen_echo", "add_sub"]
MAX_SEED = 16384  # longer candidates are left out (the targets' MAX_LEN is about this)


class Recorder:
    """A TCP proxy on 127.0.0.1 in front of `port`: relays both ways, keeps what each client sent."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.streams: list[bytearray] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            sent = bytearray()
            with self._lock:
                self.streams.append(sent)
            threading.Thread(target=self._pipe, args=(client, server, sent), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, None), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, keep: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if keep is not None:
                    keep += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> list[bytes]:
        self.listener.close()
        with self._lock:
            return [bytes(s) for s in self.streams if s]


def tritonclient_traffic(url: str) -> None:
    """What an unmodified tritonclient.http sends (errors the server answers are part of the traffic)."""
    import numpy as np
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException

    dtypes = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
              "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
              "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_}

    def sample(dt: str) -> Any:
        if dt == "BYTES":
            return np.array([b"", b"hello", "h\u00e9llo".encode(), b"x\x00y"], dtype=np.object_)
        if dt == "BOOL":
            return np.array([True, False, True], dtype=np.bool_)
        np_dt = dtypes[dt]
        if np.issubdtype(np_dt, np.integer):
            info = np.iinfo(np_dt)
            return np.array([info.min, 0, 1, info.max], dtype=np_dt)
        return np.array([-1.5, 0.0, 3.25, np.finfo(np_dt).max], dtype=np_dt)

    def call(fn: Any, *args: Any, quiet: bool = False, **kw: Any) -> None:
        try:
            fn(*args, **kw)
        except InferenceServerException as exc:
            if not quiet:
                print(f"  (answered: {str(exc)[:100]})")

    client = httpclient.InferenceServerClient(url)
    call(client.is_server_live)
    call(client.is_server_ready)
    call(client.get_server_metadata)
    call(client.get_model_metadata, "identity")
    call(client.get_model_config, "identity")
    call(client.get_inference_statistics, "identity")
    call(client.get_model_repository_index)
    for binary in (False, True):
        inputs, outputs = [], []
        for dt in dtypes:
            if dt == "FP16" and not binary:
                continue  # JSON has no FP16 (tritonclient refuses it)
            data = sample(dt)
            inp = httpclient.InferInput(f"INPUT_{dt}", list(data.shape), dt)
            inp.set_data_from_numpy(data, binary_data=binary)
            inputs.append(inp)
            outputs.append(httpclient.InferRequestedOutput(f"OUTPUT_{dt}", binary_data=binary))
        call(client.infer, "identity", inputs, outputs=outputs, request_id=f"all-{binary}")
        for dt in dtypes:  # one datatype per request too: the simple forms the fast paths read (the model
            if dt == "FP16" and not binary:  # answers 400, wanting all thirteen: the request is what counts)
                continue
            data = sample(dt)
            inp = httpclient.InferInput(f"INPUT_{dt}", list(data.shape), dt)
            inp.set_data_from_numpy(data, binary_data=binary)
            call(client.infer, "identity", [inp], quiet=True)
    try:
        import ml_dtypes

        bf = np.array([1.0, -2.5, 0.0], dtype=ml_dtypes.bfloat16)
        inp = httpclient.InferInput("INPUT0", [3], "BF16")
        inp.set_data_from_numpy(bf, binary_data=True)
        call(client.infer, "identity_bf16", [inp])
    except ImportError:
        print("  (ml_dtypes missing: no BF16 request)")
    x = np.arange(16, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [16], "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    call(client.infer, "identity_fp32", [inp], request_id="params-1", parameters={"p_str": "v", "p_int": 7,
                                                                                   "p_bool": True, "p_float": 0.5})
    call(client.infer, "identity_fp32", [inp], sequence_id=42, sequence_start=True, sequence_end=True,
         priority=1, timeout=1_000_000)
    call(client.infer, "identity_fp32", [inp], request_compression_algorithm="gzip",
         response_compression_algorithm="gzip")
    call(client.infer, "identity_fp32", [inp], request_compression_algorithm="deflate")
    out = httpclient.InferRequestedOutput("OUT", class_count=2)
    call(client.infer, "classify", [inp], outputs=[out, httpclient.InferRequestedOutput("OUT_INT32",
                                                                                          class_count=3)])
    # system shared memory: inputs and outputs in a region
    key, name = "/inferd_seed_region", "seed_region"
    handle = shm.create_shared_memory_region(name, key, 128)
    try:
        shm.set_shared_memory_region(handle, [x])
        call(client.register_system_shared_memory, name, key, 128)
        inp = httpclient.InferInput("INPUT0", [16], "FP32")
        inp.set_shared_memory(name, 64)
        res = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        res.set_shared_memory(name, 64, offset=64)
        call(client.infer, "identity_fp32", [inp], outputs=[res])
        call(client.get_system_shared_memory_status)
        call(client.unregister_system_shared_memory, name)
    finally:
        shm.destroy_shared_memory_region(handle)
    # async requests: several connections at once
    pool = httpclient.InferenceServerClient(url, concurrency=3)
    inp = httpclient.InferInput("INPUT0", [16], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    for pending in [pool.async_infer("identity_fp32", [inp]) for _ in range(6)]:
        pending.get_result()
    pool.close()
    client.close()


def raw_traffic(port: int) -> None:
    """What tritonclient does not send: the raw binary form, and generate."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = struct.pack("<16f", *range(16))
    conn.request("POST", "/v2/models/identity_fp32/infer", body, {"Inference-Header-Content-Length": "0",
                                                                   "Content-Type": "application/octet-stream"})
    conn.getresponse().read()
    for path, doc in (("/v2/models/gen_echo/generate", {"text_input": "hello", "parameters": {"repeat": 2}}),
                      ("/v2/models/gen_echo/versions/1/generate", {"text_input": "x", "repeat": 3})):
        conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
        conn.getresponse().read()
    conn.close()


def perf_analyzer(url: str) -> None:
    exe = Path(sys.executable).parent / "perf_analyzer"
    if not exe.exists():
        print("  (no perf_analyzer in this tritonclient install: skipped)")
        return
    for extra in ([], ["--input-data", "zero"]):
        subprocess.run([str(exe), "-m", "identity_fp32", "-u", url, "-i", "http", "--shape", "INPUT0:16",
                        "--measurement-interval", "500", "-p", "500", *extra], check=False, timeout=120)


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: h\r\n%sContent-Length: %d\r\n\r\n%s" % (path.encode(), extra, len(body), body)


_INFER = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,2]}]}'
_GET = b"GET /v2/health/ready HTTP/1.1\r\nHost: h\r\n\r\n"
_CHUNKED = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
# request smuggling shapes and the other framing a hostile client tries (issue 38; tests/e2e/test_http_framing.py,
# tests/e2e/test_malformed.py): each is sent alone and with a request pipelined after it
ADVERSARIAL = [
    _CHUNKED + b"%x\r\n%s\r\n0\r\n\r\n" % (len(_INFER), _INFER),
    _CHUNKED + b"4;ext=1;q=\"x\"\r\nabcd\r\n0\r\nX-Trailer: 1\r\nContent-Length: 5\r\n\r\n",
    _CHUNKED + b"3\r\nabc\r\n0\r\nX-Trailer: " + b"a" * 24000,  # (issue 38 item 1: a trailer line that never ends)
    _CHUNKED + b"ffffffffffffffff\r\n",
    _CHUNKED + b"3\nabc\n0\n\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n folded\r\n\r\nabc",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length : 3\r\n\r\nabc",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: upgrade\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_INFER), _INFER),
    b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    b"POST /x HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /v2/health/ready HTTP/1.0\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    b"GET http://h/v2/health/ready HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\nHost: h\n\n",
    b"\r\n\r\nGET /v2/health/ready HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET /v2/models/a\x00b HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 12 + b"\r\n",
    _post("/v2/models/m/infer", b"x" * 1500),
    _post("/v2/models/m/infer", b"{}", b"Inference-Header-Content-Length: 2\r\n"),
    _post("/v2/models/m/infer", _INFER, b"Content-Encoding: gzip\r\n"),
]


def adversarial_streams() -> list[bytes]:
    return ADVERSARIAL + [case + _GET for case in ADVERSARIAL]


def split_messages(stream: bytes) -> list[bytes]:
    """The requests of a client's stream (Content-Length framing; the rest whole when it is not)."""
    out = []
    pos = 0
    while pos < len(stream):
        end = stream.find(b"\r\n\r\n", pos)
        if end < 0:
            out.append(stream[pos:])
            break
        head = stream[pos:end].lower()
        if b"transfer-encoding" in head:
            out.append(stream[pos:])
            break
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip() == b"content-length":
                length = int(value.strip())
        out.append(stream[pos:end + 4 + length])
        pos = end + 4 + length
    return out


def _header(msg: bytes, name: bytes) -> bytes | None:
    head = msg.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return None


_DATA = re.compile(rb'"data"\s*:\s*\[[^\]]*\]')
_ID = re.compile(rb'"id"\s*:\s*"[^"]*"')
_SHAPE = re.compile(rb'"shape"\s*:\s*\[')


def _json_pairs(body: bytes) -> list[tuple[bytes, bytes]]:
    """(a body the codec learns from, another it then reads) for json_request: the same document with other
    numbers in its data arrays (the pattern's holes), another id, another shape (outside the holes)."""
    def bump(m: re.Match[bytes]) -> bytes:
        return re.sub(rb"[0-8]", lambda d: bytes([d.group()[0] + 1]), m.group())

    others = [_DATA.sub(bump, body), _ID.sub(b'"id":"other-id"', body),
              _SHAPE.sub(lambda m: m.group() + b"1,", body, 1)]
    return [(body, o) for o in others if o != body]


def candidates(streams: list[bytes]) -> dict[str, set[bytes]]:
    import _plane

    out: dict[str, set[bytes]] = {"http1_request": set(), "json_request": set(), "binary_tensors": set()}
    for stream in streams:
        msgs = split_messages(stream)
        out["http1_request"].add(b"\0\0" + b"".join(msgs[:3]))
        for msg in msgs:
            out["http1_request"].add(b"\0\0" + msg)
            line = msg.split(b"\r\n", 1)[0].split(b" ")
            if len(line) < 2 or not line[1].endswith(b"/infer") or _header(msg, b"content-encoding"):
                continue
            body = msg.split(b"\r\n\r\n", 1)[1]
            hlen = _header(msg, b"inference-header-content-length")
            if hlen is None:
                out["json_request"].add(body)
                out["json_request"].update(learnt + b"\0" + other for learnt, other in _json_pairs(body))
            else:
                model = line[1].split(b"/")[3].decode()
                prefix = f"{model} " if model in _plane.MODELS else ""
                out["binary_tensors"].add(prefix.encode() + hlen + b"\n" + body)
    for stream in adversarial_streams():
        out["http1_request"].add(b"\0\0" + stream)
    return {k: {c for c in v if len(c) <= MAX_SEED} for k, v in out.items()}


def measured() -> list[bytes]:
    """The adversarial streams in 64-byte reads with small caps and the memory check on (byte 1 bit 6): kept
    as they are, not merged by coverage (the check adds none; it is what finds a buffer that grows)."""
    return [b"\x08\x41" + struct.pack("<H", 64) + stream for stream in adversarial_streams()]  # (64-byte reads)


def capture() -> list[bytes]:
    import conftest

    class Tmp:
        def __init__(self) -> None:
            self.root = Path(tempfile.mkdtemp(prefix="inferd-seeds-"))

        def mktemp(self, name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=name, dir=self.root))

    tmp = Tmp()
    factory = conftest.ServerFactory(tmp)  # type: ignore[arg-type]
    try:
        server = factory(MODELS, wait_ready=["identity", "identity_fp32", "classify", "gen_echo"],
                         inferd_args=["--allow-client-shm=true"])
        rec = Recorder(server.http_port)
        url = f"127.0.0.1:{rec.port}"
        print(f"recording tritonclient.http against inferd via {url}")
        tritonclient_traffic(url)
        raw_traffic(rec.port)
        perf_analyzer(url)
        return rec.close()
    finally:
        factory.close()
        shutil.rmtree(tmp.root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="print what would be added, write nothing")
    args = ap.parse_args()
    streams = capture()
    print(f"captured {len(streams)} connections, {sum(map(len, streams))} bytes")
    import run

    for name, cands in candidates(streams).items():
        if args.dry_run:
            print(f"{name}: {len(cands)} candidates")
            continue
        added = run.add_seeds(name, sorted(cands))
        print(f"{name}: {len(cands)} candidates, {added} added to fuzz/corpus/{name}/")
    if not args.dry_run:
        kept = harness.CORPUS_DIR / "http1_request"
        new = [s for s in measured() if not (kept / harness.content_name(s)).exists()]
        for s in new:
            harness.save_input(kept, s)
        print(f"http1_request: {len(new)} adversarial streams with the memory check added")
    return 0


if __name__ == "__main__":
    sys.exit(main())
