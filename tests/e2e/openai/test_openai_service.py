"""The OpenAI port as a service: the models list, /metrics and /health/ready on it, generic embeddings,
request size (Triton's test_request_size.py and test_observability.py), unknown routes and methods, a client
that goes away (its request is cancelled in the model within 100 ms) and a client that stops reading (the
server stops generating for it instead of holding an unbounded backlog)."""

from __future__ import annotations

import base64
import json
import os
import socket
import time

import httpx
import numpy as np
import openai_servers
import psutil
import pytest

openai = pytest.importorskip("openai")

MAX_INPUT = 1 << 20


def embed(text):  # tests/fixtures/models/text_embed
    out = [0.0] * 8
    for i, ch in enumerate(text):
        out[i % 8] += ord(ch) / 1000.0
    return out


@pytest.fixture(scope="module")
def srv(module_server_factory, harness, tmp_path_factory):
    return openai_servers.main(module_server_factory, harness, cancel_dir=tmp_path_factory.mktemp("cancelled"),
                               extra=["--http-max-input-size", str(MAX_INPUT)])


def cancelled_prompts(srv):
    out = {}
    for entry in os.scandir(srv.cancel_dir):
        if entry.name.startswith("cancelled_") and not entry.name.endswith(".tmp"):
            with open(entry.path) as f:
                out[f.read()] = entry.stat().st_mtime
    return out


def wait_cancelled(srv, harness, marker, timeout=20.0):
    return harness.wait_for(lambda: next((t for p, t in cancelled_prompts(srv).items() if marker in p), None),
                            timeout, f"the model to see request {marker} cancelled")


# ---- models and observability ----


def test_models_list_and_get(srv):
    c = srv.client()
    models = {m.id: m for m in c.models.list()}
    assert set(models) == {"llm_trtllm", "llm_trtllm_counts", "llm_slow", "text_embed", "vllm_embed", "identity"}
    for m in models.values():
        assert m.object == "model" and m.created > 0 and m.owned_by == "Triton Inference Server"
    one = c.models.retrieve("llm_trtllm")
    assert one.id == "llm_trtllm" and one.created == models["llm_trtllm"].created
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


def test_health_metrics_and_routes(srv):
    assert httpx.get(srv.base + "/health/ready").status_code == 200
    metrics = httpx.get(srv.base + "/metrics")
    assert metrics.status_code == 200 and "nv_cpu_utilization" in metrics.text
    missing = httpx.get(srv.base + "/does-not-exist")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong = httpx.get(srv.base + "/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["message"]


# ---- embeddings from any text-in vector-out model ----


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_generic_embeddings(srv, encoding):
    c = srv.client()
    result = c.embeddings.create(model="text_embed", input=["first text", "second"], encoding_format=encoding)
    assert [d.index for d in result.data] == [0, 1]
    for d, text in zip(result.data, ["first text", "second"]):
        vector = d.embedding
        if isinstance(vector, str):
            vector = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
        assert np.allclose(vector, embed(text), atol=1e-5)
    assert result.usage.prompt_tokens > 0  # counted by the model's tokenizer


@pytest.mark.parametrize("body, status, message", [
    ({}, 422, "Field required"),
    ({"input": "x"}, 422, "Field required"),
    ({"model": 123, "input": "x"}, 422, "Input should be a valid string"),
    ({"model": None, "input": "x"}, 422, "Input should be a valid string"),
    ({"model": "", "input": "x"}, 404, "Unknown model: "),
    ({"model": "Invalid", "input": "x"}, 404, "Unknown model: Invalid"),
    ({"model": "text_embed"}, 422, "Field required"),
    ({"model": "text_embed", "input": ""}, 422, "Value should have at least 1 item after validation, not 0"),
    ({"model": "text_embed", "input": []}, 422, "Value should have at least 1 item after validation, not 0"),
    ({"model": "text_embed", "input": 123}, 422, "Input should be a valid string"),
    ({"model": "text_embed", "input": 1.5}, 422, "Input should be a valid string"),
    ({"model": "text_embed", "input": "x", "encoding_format": "invalid"}, 422, "encoding_format"),
    ({"model": "text_embed", "input": "x", "encoding_format": 0}, 422, "encoding_format"),
    ({"model": "text_embed", "input": "x", "dimensions": 3}, 400, "makes vectors of 8 dimensions"),
    ({"model": "llm_trtllm", "input": "x"}, 400, "cannot create embeddings"),
])
def test_embedding_refusals(srv, body, status, message):
    r = httpx.post(srv.base + "/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]


# ---- request size (Triton's RequestSizeLimitMiddleware cases) ----


def _too_large(r, size):
    assert r.status_code == 413
    assert r.json() == {"error": {
        "message": f"Request size {'of %d bytes ' % size if size else ''}exceeds the maximum allowed input size of "
                   f"{MAX_INPUT} bytes. Use --http-max-input-size to increase the limit.",
        "type": "invalid_request_error", "param": None, "code": "content_too_large"}}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_body_at_the_limit_is_read_and_over_it_refused(srv, path):
    assert httpx.post(srv.base + path, content=b"x" * MAX_INPUT).status_code == 400  # read: not JSON
    _too_large(httpx.post(srv.base + path, content=b"x" * (MAX_INPUT + 1)), MAX_INPUT + 1)

    def chunks():
        yield b"x" * MAX_INPUT
        yield b"x"

    _too_large(httpx.post(srv.base + path, content=chunks()), 0)


# ---- a client that leaves, a client that does not read ----


def _open_stream(srv, body, rcvbuf=0):
    sock = socket.socket()
    if rcvbuf:  # before connecting: the window the client offers stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", srv.port))
    raw = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    return sock


def test_disconnect_cancels_the_request_in_the_model_within_100ms(srv, harness):
    marker = "leave-%d" % time.monotonic_ns()
    sock = _open_stream(srv, {"model": "llm_slow", "stream": True, "max_tokens": 5000,
                              "messages": [{"role": "user", "content": marker + " COUNT:5000"}]})
    got = b""
    while got.count(b"data: ") < 3:  # the role chunk and two tokens: the model is generating
        got += sock.recv(65536)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    left = time.time()
    sock.close()
    seen = wait_cancelled(srv, harness, marker)
    assert seen - left < 0.1, f"the model saw the cancellation {1000 * (seen - left):.0f} ms after the client left"


# small, so the client's socket fills soon; but not under loopback's MSS (64 KiB): a receive window that can never
# open to a full segment leaves the sender to zero-window probes, whose backoff outlasted the test's 60 s read
# timeout (seen: 2.7 MB in the server's send queue, the client's empty)
RCVBUF = 65536


def test_a_reader_that_stops_does_not_make_the_server_hold_the_stream(srv, harness):
    """A client that stops reading a long stream: the server's memory stays flat while it sits still (the
    connection stops taking the model's responses once the socket is full; at most 4096 then wait in the
    request's ResponseStream), and the stream still reads out well-formed once the client reads again."""
    server = psutil.Process(srv.server.pid)
    before = server.memory_info().rss
    marker = "stall-%d" % time.monotonic_ns()
    sock = _open_stream(srv, {"model": "llm_trtllm", "stream": True, "max_tokens": 20000,
                              "messages": [{"role": "user", "content": marker + " COUNT:20000"}]}, rcvbuf=RCVBUF)
    deadline = time.monotonic() + 5.0
    peak = 0
    while time.monotonic() < deadline:  # the client sits still for 5 s while the model could stream on
        peak = max(peak, server.memory_info().rss - before)
        time.sleep(0.1)
    assert peak < 64 << 20, f"the server grew {peak >> 20} MiB for one stalled stream"
    sock.settimeout(60)
    rest = b""
    while not rest.endswith(b"0\r\n\r\n"):
        data = sock.recv(1 << 20)
        if not data:
            break
        rest += data
    sock.close()
    assert b"data: [DONE]" in rest
    assert rest.count(b'"content":') <= 20002  # the role chunk, the tokens, the finish (or an error event)


def _read_stream_to_end(sock, buf=b""):
    """One streamed answer read through its last chunk (the connection stays open); returns head+body, rest."""
    while b"\r\n0\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, f"the connection closed before the stream's end: {buf[-200:]!r}"
        buf += data
    end = buf.index(b"\r\n0\r\n\r\n") + len(b"\r\n0\r\n\r\n")
    return buf[:end], buf[end:]


def test_the_connection_stays_open_after_a_stream_and_a_later_stream_on_it_still_cancels(srv, harness):
    """A finished stream leaves the connection open (HTTP/1.1 keep-alive, what httpx and the openai SDK
    expect: no new connection per request); the next requests on it are answered, and a client that leaves
    in the middle of a stream on that kept connection still cancels the request in the model within 100 ms.
    Before: every stream ended with `Connection: close`."""
    marker = "kept-%d" % time.monotonic_ns()
    sock = _open_stream(srv, {"model": "llm_trtllm", "stream": True, "max_tokens": 3,
                              "messages": [{"role": "user", "content": "COUNT:3"}]})
    answer, rest = _read_stream_to_end(sock)
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" not in answer.lower(), answer
    assert b"data: [DONE]" in answer and rest == b""
    raw = json.dumps({"model": "llm_trtllm", "messages": [{"role": "user", "content": "COUNT:2"}]}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    got = b""
    while b'"finish_reason"' not in got:
        data = sock.recv(65536)
        assert data, f"closed before the second answer: {got!r}"
        got += data
    assert got.startswith(b"HTTP/1.1 200"), got
    body = json.dumps({"model": "llm_slow", "stream": True, "max_tokens": 5000,
                       "messages": [{"role": "user", "content": marker + " COUNT:5000"}]}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < 3:
        data = sock.recv(65536)
        assert data, f"closed before the third answer: {got!r}"
        got += data
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    left = time.time()
    sock.close()
    seen = wait_cancelled(srv, harness, marker)
    assert seen - left < 0.1, f"the model saw the cancellation {1000 * (seen - left):.0f} ms after the client left"


def test_the_openai_sdk_streams_over_one_connection(srv):
    """httpx (under the openai SDK's async client, which reads a stream to its end after `[DONE]`) reuses the
    kept connection: three streams, one TCP connection."""
    import asyncio

    server = psutil.Process(srv.server.pid)

    def peers():
        return {c.raddr for c in server.net_connections("tcp") if c.laddr.port == srv.port and c.raddr}

    async def three() -> set:
        seen = set()
        async with srv.async_client() as client:
            for _ in range(3):
                stream = await client.chat.completions.create(
                    model="llm_trtllm", stream=True, max_tokens=2, messages=[{"role": "user", "content": "COUNT:2"}])
                text = "".join([ch.choices[0].delta.content or "" async for ch in stream])
                assert text == "1 2"
                seen |= peers()
        return seen

    before = peers()
    seen = asyncio.run(three()) - before
    assert len(seen) == 1, seen
