"""What Triton's own qa suites (v2.51.0: L0_http, L0_optional_input) check over HTTP and inferd answered
otherwise (issue 43 item 10). Each passes against Triton 2.51 (INFERD_E2E_TARGET=triton); the inferd-only
parts (the connection closing after a chunked body beside a Content-Length) are marked in place.

- a request with both Content-Length and Transfer-Encoding: chunked (qa http_test.py
  test_content_encoding_chunked_manually: `requests` adds a Content-Length to the chunk-encoded bytes) is
  read as chunked; inferd answered 400;
- /generate and /generate_stream refuse an input named twice (qa generate_endpoint_test.py
  test_duplicate_inputs) and keep a repeated parameter's first value; inferd took the last of each;
- a model error before the first response of /generate_stream starts the event stream with status 400
  (qa test_generate_stream_response_error); inferd answered 200 (or a 500 JSON error), and a model error on
  /generate is 400 whatever its code (inferd: 500);
- the input-count error of a model with optional inputs names the range (qa test_missing_inputs:
  "expected number of inputs between 2 and 3 but got 1");
- `--model-control-mode POLL` (upper case) starts the server (qa runs it so).

Fixture models: gen_echo (text_input, optional repeat; parameter suffix), gen_stream (decoupled, "fail"
words answer errors), error (INPUT0 picks an error: 0 raises, 1 an error response, 2 one with INVALID_ARG).
"""

from __future__ import annotations

import json
import socket
import struct

import httpx
import pytest

WAIT_S = 30.0
MODELS = ["gen_echo", "gen_stream", "error"]
SSE = "text/event-stream; charset=utf-8"


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


def _post(server, path: str, body: str | bytes) -> httpx.Response:
    with httpx.Client(timeout=WAIT_S) as client:
        return client.post(f"{server.http_base}{path}", content=body)


def _events(text: str) -> list[dict]:
    return [json.loads(b[len("data: "):]) for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]


# ---- Content-Length beside Transfer-Encoding: chunked ----------------------------------------------------

def _read_answer(sock: socket.socket) -> tuple[bytes, dict[str, str], bytes, bool]:
    """(status line, headers, body, closed after it) of one answer read off `sock`."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(65536)
        assert chunk, "closed inside an answer"
        rest += chunk
    body, extra = rest[:n], rest[n:]
    assert not extra, f"more than one answer: {extra[:200]!r}"
    sock.settimeout(5.0)
    try:
        closed = sock.recv(1) == b""
    except TimeoutError:
        closed = False
    return lines[0].encode(), headers, body, closed


@pytest.mark.parametrize("order", ["length-first", "chunked-first"])
def test_chunked_body_beside_a_content_length(server, harness, order):
    """qa test_content_encoding_chunked_manually: a raw binary input chunk-encoded by hand, sent by `requests`
    with its own Content-Length (the length of the encoded bytes). Triton reads the chunked body; inferd
    answered 400 ("Transfer-Encoding can't be present with Content-Length"). inferd also closes the
    connection after answering (RFC 9112 6.3); Triton keeps it open."""
    raw = struct.pack("<i", 7)
    encoded = b"%X\r\n%s\r\n0\r\n\r\n" % (len(raw), raw)
    framing = [b"Content-Length: %d" % len(encoded), b"Transfer-Encoding: chunked"]
    if order == "chunked-first":
        framing.reverse()
    head = b"\r\n".join([b"POST /v2/models/error/infer HTTP/1.1", b"Host: x", b"Inference-Header-Content-Length: 0",
                         *framing]) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=WAIT_S) as sock:
        sock.sendall(head + encoded)
        status, headers, body, closed = _read_answer(sock)
    assert status.startswith(b"HTTP/1.1 200"), (status, body[:300])
    json_len = int(headers["inference-header-content-length"])
    doc = json.loads(body[:json_len])
    assert doc["outputs"][0]["shape"] == [1]
    assert struct.unpack("<i", body[json_len:]) == (7,)
    if not harness.target_is_triton():
        assert closed and headers.get("connection") == "close"


# ---- /generate: repeated keys ----------------------------------------------------------------------------

@pytest.mark.parametrize("body,message", [
    ('{"text_input": "hello", "repeat": 1, "text_input": "duplicate"}', "input 'text_input' already exists"),
    ('{"text_input": "hello", "repeat": 1, "repeat": 1}', "input 'repeat' already exists"),
    ('{"text_input": "hello", "repeat": 1, "text_input": "duplicate", "repeat": 2}',
     "input 'text_input' already exists"),
    ('{"text_input": "hello", "repeat": 1, "repeat": 2, "text_input": "duplicate"}', "input 'repeat' already exists"),
    ('{"text_input": "a", "repeat": 2, "parameters": {"repeat": 3}}',
     "Converting keyword: 'parameters': [request id: <id_unknown>] input 'repeat' already exists in request"),
    ('{"id": "q7", "text_input": "a", "text_input": "b"}', "[request id: q7] input 'text_input' already exists"),
])
def test_generate_refuses_an_input_named_twice(server, body, message):
    """qa test_duplicate_inputs: inferd read the JSON with the last value of each key and answered 200."""
    for path in ("generate", "generate_stream"):
        resp = _post(server, f"/v2/models/gen_echo/{path}", body)
        assert resp.status_code == 400, resp.text
        assert resp.headers["content-type"] == "application/json"
        assert message in resp.json()["error"]


@pytest.mark.parametrize("body,output,rid", [
    ('{"text_input": "a", "suffix": "x", "suffix": "y"}', "Ax", None),
    ('{"text_input": "a", "parameters": {"suffix": "x", "suffix": "y"}}', "Ax", None),
    ('{"text_input": "a", "suffix": "x", "suffix": {"an": "object"}}', "Ax", None),
    ('{"text_input": "a", "suffix": "x", "parameters": {"suffix": "y"}}', "Ay", None),
    ('{"text_input": "a", "parameters": {"suffix": "y"}, "suffix": "x"}', "Ax", None),
    ('{"text_input": "a", "parameters": {"suffix": "y"}, "parameters": 5}', "Ay", None),
    ('{"text_input": "a", "id": "1", "id": 2}', "A", "1"),
])
def test_generate_reads_a_repeated_key_as_triton_does(server, body, output, rid):
    """Each member name in order, with its first value: a repeated parameter keeps its first value, a later
    "parameters" entry overrides a top-level one. inferd kept the last value of each key."""
    resp = _post(server, "/v2/models/gen_echo/generate", body)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["text_output"] == output
    assert doc.get("id") == rid


# ---- /generate_stream: an error before the first response ------------------------------------------------

def test_error_response_first_starts_the_stream_with_400(server):
    """qa test_generate_stream_response_error: the first response sets the status; the responses after the
    error still come. inferd answered 200."""
    resp = _post(server, "/v2/models/gen_stream/generate_stream", '{"text_input": "fail one"}')
    assert resp.status_code == 400
    assert resp.headers["content-type"] == SSE
    assert _events(resp.text) == [
        {"error": "failed at word 0"},
        {"model_name": "gen_stream", "model_version": "1", "text_output": "one", "index": 1},
    ]
    resp = _post(server, "/v2/models/gen_stream/generate_stream", '{"text_input": "one fail"}')
    assert resp.status_code == 200 and resp.headers["content-type"] == SSE
    assert [e.get("error") for e in _events(resp.text)] == [None, "failed at word 1"]


@pytest.mark.parametrize("magic,message", [
    (0, "error model: deliberate exception in execute"),
    (1, "error model: deliberate response error"),
    (2, "error model: deliberate invalid argument"),
])
def test_model_error_of_a_non_decoupled_model_on_generate(server, magic, message):
    """The model's error is its answer: /generate_stream starts an event stream with status 400 holding it
    (inferd answered a plain JSON error, 500 for 0 and 1), /generate answers 400 (inferd: 500 for 0 and 1)."""
    body = json.dumps({"INPUT0": magic})
    resp = _post(server, "/v2/models/error/generate_stream", body)
    assert resp.status_code == 400 and resp.headers["content-type"] == SSE, resp.text
    events = _events(resp.text)
    assert len(events) == 1 and message in events[0]["error"]
    resp = _post(server, "/v2/models/error/generate", body)
    assert resp.status_code == 400 and resp.headers["content-type"] == "application/json"
    assert message in resp.json()["error"]


def test_refusals_before_the_stream_stay_plain_json(server):
    """A request refused before it runs keeps its own status as a plain JSON error (qa
    generate_stream_expect_failure checks the content type)."""
    resp = _post(server, "/v2/models/gen_echo/generate_stream", '{"text_input": 5}')
    assert resp.status_code in (400, 500) and resp.headers["content-type"] == "application/json"
    resp = _post(server, "/v2/models/nope/generate_stream", '{"text_input": "x"}')
    assert resp.status_code == 404 and resp.headers["content-type"] == "application/json"


# ---- the input count of a model with optional inputs -----------------------------------------------------

def test_input_count_error_names_the_range_of_optional_inputs(server):
    """qa L0_http test_missing_inputs / L0_optional_input: inferd said "expected 1 inputs" for a model with
    one required and one optional input."""
    for path in ("generate", "generate_stream"):
        resp = _post(server, f"/v2/models/gen_echo/{path}", '{"other": "param"}')
        assert resp.status_code == 400 and resp.headers["content-type"] == "application/json"
        assert "expected number of inputs between 1 and 2 but got 0 inputs for model 'gen_echo'" in resp.json()["error"]
    inputs = [{"name": n, "datatype": "INT32", "shape": [1], "data": [1]} for n in ("repeat", "other", "more")]
    resp = _post(server, "/v2/models/gen_echo/infer", json.dumps({"inputs": inputs}))
    assert resp.status_code == 400
    assert "expected number of inputs between 1 and 2 but got 3 inputs" in resp.json()["error"]
    # a model without optional inputs keeps the exact count
    inputs = [{"name": n, "datatype": "INT32", "shape": [1], "data": [1]} for n in ("INPUT0", "X")]
    resp = _post(server, "/v2/models/error/infer", json.dumps({"inputs": inputs}))
    assert resp.status_code == 400 and "expected 1 inputs but got 2 inputs" in resp.json()["error"]


# ---- --model-control-mode in upper case ------------------------------------------------------------------

def test_model_control_mode_in_upper_case(server_factory):
    """Triton's qa starts tritonserver with --model-control-mode=POLL; inferd refused the value."""
    srv = server_factory(["gen_echo"], control_mode="POLL")
    resp = _post(srv, "/v2/models/gen_echo/generate", '{"text_input": "up"}')
    assert resp.status_code == 200 and resp.json()["text_output"] == "UP"
