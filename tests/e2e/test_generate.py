"""Triton's HTTP generate extension: /generate (one JSON object) and /generate_stream (server-sent
events), for decoupled and non-decoupled models, with curl, httpx and urllib; bad bodies; a dropped
SSE connection cancels the request.

Fixture models: gen_echo (text_input -> upper-cased text_output + length; optional input `repeat`,
parameter `suffix`), gen_stream (decoupled: one response per word, "fail" gives an error response),
decoupled_cancel (streams until cancelled, then writes the marker file it was given).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest

WAIT_S = 30.0
MODELS = ["gen_echo", "gen_stream", "decoupled_cancel"]
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses")


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


def post(server, path: str, doc) -> tuple[int, dict]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    status, raw = server.post(path, body, timeout=WAIT_S)
    return status, json.loads(raw)


def sse_events(text: str) -> list[dict]:
    """`data: {...}` events of an SSE body (blank-line separated)."""
    events = []
    for block in text.split("\n\n"):
        block = block.strip("\r\n")
        if block:
            assert block.startswith("data: "), block
            events.append(json.loads(block[len("data: "):]))
    return events


def test_generate_maps_keys_to_inputs_and_parameters(server):
    status, doc = post(server, "/v2/models/gen_echo/generate", {"text_input": "hello world"})
    assert status == 200
    assert doc == {"model_name": "gen_echo", "model_version": "1", "text_output": "HELLO WORLD", "length": 11}
    # an extra top-level key is a request parameter; "parameters" may carry inputs too; "id" comes back
    status, doc = post(server, "/v2/models/gen_echo/versions/1/generate",
                       {"text_input": ["hi"], "suffix": "!", "parameters": {"repeat": 2}, "id": "q1"})
    assert status == 200
    assert doc == {"model_name": "gen_echo", "model_version": "1", "id": "q1", "text_output": "HI HI!",
                   "length": 6}


def test_generate_of_a_decoupled_model(server, harness):
    status, doc = post(server, "/v2/models/gen_stream/generate", {"text_input": "single"})
    assert (status, doc) == (200, {"model_name": "gen_stream", "model_version": "1", "text_output": "single",
                                   "index": 0})
    status, doc = post(server, "/v2/models/gen_stream/generate", {"text_input": "fail"})
    assert doc == {"error": "failed at word 0"} and status == 400
    for text in ("one two three", ""):  # several responses, or none
        status, doc = post(server, "/v2/models/gen_stream/generate", {"text_input": text})
        assert doc == {"error": ONE_RESPONSE}
        if not harness.target_is_triton():  # Triton answers this one with status 200
            assert status == 400


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_generate_stream_with_curl(server):
    url = f"{server.http_base}/v2/models/gen_stream/generate_stream"
    proc = subprocess.run(
        ["curl", "-sS", "-N", "-i", "-X", "POST", url, "-H", "Content-Type: application/json",
         "-d", json.dumps({"text_input": "one fail three"})],
        capture_output=True, text=True, timeout=WAIT_S, check=True)
    head, _, body = proc.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.1 200")
    assert "content-type: text/event-stream; charset=utf-8" in head.lower()
    assert sse_events(body) == [
        {"model_name": "gen_stream", "model_version": "1", "text_output": "one", "index": 0},
        {"error": "failed at word 1"},
        {"model_name": "gen_stream", "model_version": "1", "text_output": "three", "index": 2},
    ]


def test_generate_stream_with_httpx_arrives_as_produced(server):
    url = f"{server.http_base}/v2/models/gen_stream/generate_stream"
    words = ["a", "b", "c", "d"]
    with httpx.Client(timeout=WAIT_S) as client, \
            client.stream("POST", url, json={"text_input": " ".join(words), "delay_ms": 50}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
        got = []
        for line in resp.iter_lines():
            if line.startswith("data: "):
                got.append(json.loads(line[6:])["text_output"])
    assert got == words


def test_generate_stream_of_a_non_decoupled_model(server):
    with httpx.Client(timeout=WAIT_S) as client:
        resp = client.post(f"{server.http_base}/v2/models/gen_echo/generate_stream", json={"text_input": "abc"})
    assert resp.status_code == 200
    assert sse_events(resp.text) == [{"model_name": "gen_echo", "model_version": "1", "text_output": "ABC",
                                      "length": 3}]


def test_errors_before_the_first_event_keep_their_status(server):
    for path in ("generate", "generate_stream"):
        status, doc = post(server, f"/v2/models/nope/{path}", {"text_input": "x"})
        assert status == 404 and doc == {"error": "Request for unknown model: 'nope' is not found"}
        status, doc = post(server, f"/v2/models/gen_echo/{path}", {})
        assert status == 400 and "missing required input(s) ['text_input']" in doc["error"]


@pytest.mark.inferd_only  # Triton answers most of these with 500
@pytest.mark.parametrize("body,message", [
    (b"notjson", "failed to parse the request JSON buffer"),
    (b"[1]", "the generate request body must be a JSON object"),
    (b'{"text_input": 5}', "BYTES tensor 'text_input' expects JSON strings"),
    (b'{"text_input": "x", "repeat": "2"}', "tensor 'repeat' of datatype INT32 expects JSON integers"),
    (b'{"text_input": ["a", "b"]}', "The schema can not convert input 'text_input' to tensor with proper shape"),
    (b'{"text_input": "x", "parameters": 5}', "Expected JSON object for keyword: 'parameters'"),
    (b'{"text_input": "x", "obj": {"a": 1}}', "parameter 'obj' has invalid type"),
    (b'{"text_input": "x", "parameters": {"text_input": "y"}}', "input 'text_input' already exists in request"),
    (b'{"text_input": "x", "id": 7}', "'id' must be a string"),
])
def test_bad_bodies_are_400_naming_the_problem(server, body, message):
    for path in ("generate", "generate_stream"):
        status, doc = post(server, f"/v2/models/gen_echo/{path}", body)
        assert status == 400 and message in doc["error"], doc
    assert server.is_live()


def test_dropped_sse_connection_cancels_the_request(server, tmp_path):
    marker = tmp_path / "cancelled"
    url = f"{server.http_base}/v2/models/decoupled_cancel/generate_stream"
    with httpx.Client(timeout=WAIT_S) as client, \
            client.stream("POST", url, json={"DATA": [1, 2, 3], "marker": str(marker)}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                assert json.loads(line[6:])["SUM"] == 6
                break  # leaving the block drops the connection mid-stream
    server.wait_until(marker.exists, WAIT_S, "the model to observe the cancellation")
    status, doc = post(server, "/v2/models/gen_echo/generate", {"text_input": "still fine"})
    assert status == 200 and doc["text_output"] == "STILL FINE"


def _read_chunked(sock, buf: bytes) -> tuple[str, bytes, bytes]:
    """One chunked response from `sock` (`buf`: bytes already read): its head, its body, what follows."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, f"closed before a response head: {buf!r}"
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    body = b""
    while True:
        while b"\r\n" not in buf:
            data = sock.recv(65536)
            assert data, f"closed inside a chunked body: {body!r}"
            buf += data
        size_line, _, rest = buf.partition(b"\r\n")
        size = int(size_line, 16)
        while len(rest) < size + 2:
            data = sock.recv(65536)
            assert data, f"closed inside a chunk: {body!r}"
            rest += data
        body, buf = body + rest[:size], rest[size + 2:]
        if size == 0:
            return head.decode("latin-1"), body, buf


def _stream_request(text: str, extra: bytes = b"") -> bytes:
    raw = json.dumps({"text_input": text}).encode()
    return (b"POST /v2/models/gen_stream/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"%sContent-Length: %d\r\n\r\n%s" % (extra, len(raw), raw))


def test_the_connection_stays_open_after_a_stream(server):
    """As Triton's: a finished stream leaves the connection open (no `Connection: close`) and the next request
    on it is answered; a client that asks for the close gets it. Before: every stream closed the connection."""
    import socket
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=WAIT_S) as sock:
        for words in (["a", "b"], ["c", "d", "e"]):
            sock.sendall(_stream_request(" ".join(words)))
            head, body, rest = _read_chunked(sock, b"")
            assert head.startswith("HTTP/1.1 200") and "connection: close" not in head.lower(), head
            assert [e["text_output"] for e in sse_events(body.decode())] == words
            assert rest == b""
        sock.sendall(_stream_request("z", b"Connection: close\r\n"))
        head, body, rest = _read_chunked(sock, b"")
        assert [e["text_output"] for e in sse_events(body.decode())] == ["z"]
        while True:
            data = sock.recv(65536)
            if not data:
                break
            rest += data
        assert rest == b""


@pytest.mark.inferd_only  # Triton 2.51 drops the connection in the middle of a stream with a request behind it
def test_requests_pipelined_behind_a_stream_are_answered_after_it(server):
    import socket
    raw = json.dumps({"text_input": "kept"}).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=WAIT_S) as sock:
        sock.sendall(_stream_request("c d e") + b"POST /v2/models/gen_echo/generate HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
        head, body, rest = _read_chunked(sock, b"")
        assert head.startswith("HTTP/1.1 200"), head
        assert [e["text_output"] for e in sse_events(body.decode())] == ["c", "d", "e"]
        while b"KEPT" not in rest:
            data = sock.recv(65536)
            assert data, f"closed before the pipelined answer: {rest!r}"
            rest += data
        assert rest.startswith(b"HTTP/1.1 200"), rest
