"""inferd answers as the real Triton 2.51 does (issue 38 item 11).

One inferd and one Triton (tests/tools/triton_reference.sh) serve the same repository: an identity over
every datatype (BF16, FP16, BOOL and BYTES included) with and without a batch dimension, and add_sub.
Hypothesis draws valid requests (tests/e2e/differential.py: datatypes, shapes with zero-size dims and
batch dims, NaN/inf and extreme values, unicode and non-UTF-8 BYTES, JSON or binary or shared-memory
inputs, outputs binary, JSON or to shared memory, request parameters and ids); each goes to both servers
four ways (the exact bytes over HTTP with httpx, tritonclient.http, a gRPC ModelInferRequest built with
tritonclient's protos, tritonclient.grpc) and the answers must agree: status, response document, output
datatypes, shapes and bytes (shared-memory outputs included). Invalid requests must get the same status.

What the comparison leaves aside, each not a behavioural difference:
- JSON key order: a JSON object is unordered (compared as a mapping).
- Float text: Triton's rapidjson writes some doubles with other digits than the shortest form inferd
  writes (3.4028234663852887e38 vs 3.4028234663852886e+38); both parse to the same double, compared by
  bits (so -0.0 and 0.0 stay apart, and any NaN equals NaN: JSON has one NaN).
- The value of Inference-Header-Content-Length: it is the length of that JSON text; the header's
  presence, the document and the binary bytes after it are compared.
- Error messages and an error's Content-Type (Triton sends text/plain for errors raised once the model
  has run); statuses are compared. The wording differs in places (inferd's names the tensor or region;
  Triton adds a note on max_batch_size to a shape error), never the status.

Where Triton 2.51's answer is a defect of its own, inferd answers otherwise and the draw leaves such
requests out; test_known_differences and test_known_value_differences pin each one (so a change on either
side shows), differential_cases.py says why case by case:
- Triton answers 500 where the client erred: JSON fields of the wrong type or count (1.0 for INT32, a
  number for BYTES or the id, a negative dimension, fewer values than the shape), a lone surrogate in a
  JSON string, a shared-memory output region too small for the output. inferd answers 400.
- A JSON integer out of its datatype's range (300 for INT8): Triton wraps it (44); inferd refuses (400).
- BYTES that are not UTF-8 asked for as JSON: Triton writes the raw bytes into a JSON string (its own
  client cannot parse that); inferd refuses with 400 naming the output.
- Batch size 0 on a batching model: Triton drops the batch dimension (a [0,2] request is answered as [2]), and
  a [0,0] request hangs its HTTP frontend for good (so it is never sent). inferd refuses (400).
- A zero-byte tensor in shared memory: Triton computes offset + size - 1 unsigned and refuses it (400).
- No input at all to a batching Python model: Triton's Python backend refuses (400, "out of bounds index
  0"); inferd runs the model with no inputs (200), as Triton does for a non-batching one.
- An id with a NUL: Triton cuts it there (a C string); inferd echoes it whole.
- A JSON FP64 number outside rapidjson's fast path (more than 15 digits, or a power of ten beyond 1e+-22):
  Triton may read it one ULP off (it parses without full precision); inferd reads it correctly rounded.
  JSON FP64 inputs are drawn from numbers both read exactly; any FP64 goes binary and by shared memory.
Not tested at all: classification of a BYTES output (Triton 2.51 crashes: the connection drops).

The real Triton must be set up (`bash tests/tools/triton_reference.sh setup`, about a minute); without it
these tests skip, except where INFERD_REQUIRE_TRITON=1 (set by .ci/run) makes that a failure.
Hypothesis is derandomized (the same examples every run); INFERD_DIFF_SEED=<n> draws other ones and
INFERD_DIFF_EXAMPLES=<n> (default 50) sets how many.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf.json_format import MessageToDict
from hypothesis import HealthCheck, Phase, event, example, given, seed, settings
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent))
import differential as df  # noqa: E402
import differential_cases as dc  # noqa: E402
import differential_wire as dw  # noqa: E402

pytestmark = pytest.mark.inferd_only  # it starts one server of each kind itself

TIMEOUT_S = 30.0
EXAMPLES = int(os.environ.get("INFERD_DIFF_EXAMPLES", "50"))
SEED = os.environ.get("INFERD_DIFF_SEED", "").strip()
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SEED, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    # shrinking only where someone explores; the derandomized run reports the example as drawn
                    phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if SEED else [])])
LABELS = ("inferd", "triton")


# ---------------------------------------------------------------- the two servers

def _require_triton(harness: Any) -> None:
    script = harness.TRITON_SCRIPT
    ready = script.exists() and subprocess.run(["bash", str(script), "ready"], capture_output=True).returncode == 0
    if not ready:
        reason = (f"the real Triton 2.51 is not set up ({script} ready failed): run `bash "
                  "tests/tools/triton_reference.sh setup` once (about a minute; .ci/run does it)")
        if os.environ.get("INFERD_REQUIRE_TRITON") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def _repository(factory: Any) -> Path:
    repo = factory.make_repo([df.IDENTITY, df.ADD_SUB])
    twin = repo / df.IDENTITY_NOBATCH
    shutil.copytree(repo / df.IDENTITY, twin)
    config = (twin / "config.pbtxt").read_text()
    changed = (config.replace(f'name: "{df.IDENTITY}"', f'name: "{df.IDENTITY_NOBATCH}"')
               .replace(f"max_batch_size: {df.MAX_BATCH}", "max_batch_size: 0")
               .replace("dims: [ -1, -1 ]", "dims: [ -1 ]"))
    assert changed.count("dims: [ -1 ]") == 2 * len(df.DATATYPES) and "max_batch_size: 0" in changed
    (twin / "config.pbtxt").write_text(changed)
    return repo


@pytest.fixture(scope="module")
def servers(module_server_factory: Any, harness: Any) -> dict[str, Any]:
    _require_triton(harness)
    models = [df.IDENTITY, df.IDENTITY_NOBATCH, df.ADD_SUB]
    # one after the other: a server started from a helper thread would die with that thread (PDEATHSIG)
    inferd = module_server_factory(models, repo=_repository(module_server_factory),
                                   inferd_args=["--allow-client-shm", "true"], target="inferd")
    triton = module_server_factory(models, repo=_repository(module_server_factory), target="triton")
    return {"inferd": inferd, "triton": triton}


class Clients:
    """One client of each kind per server, kept for the module."""

    def __init__(self, server: Any, harness: Any) -> None:
        self.wait_for = harness.wait_for
        self.raw = httpx.Client(base_url=server.http_base, timeout=TIMEOUT_S)
        self.http = httpclient.InferenceServerClient(server.http_url, connection_timeout=10,
                                                     network_timeout=TIMEOUT_S)
        self.channel = grpc.insecure_channel(server.grpc_url)
        self.grpc = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.grpc_client = grpcclient.InferenceServerClient(server.grpc_url)

    def close(self) -> None:
        self.raw.close()
        self.http.close()
        self.channel.close()
        self.grpc_client.close()


@pytest.fixture(scope="module")
def clients(servers: dict[str, Any], harness: Any) -> Iterator[dict[str, Clients]]:
    made = {label: Clients(server, harness) for label, server in servers.items()}
    yield made
    for c in made.values():
        c.close()
    left = sorted(Path("/dev/shm").glob(f"difftest_{os.getpid()}_*"))
    assert not left, f"segments this test made are left over: {left}"  # every request removes its own


# ---------------------------------------------------------------- comparing

def json_diff(a: Any, b: Any, path: str = "$") -> list[str]:
    """Where two parsed JSON values differ: mappings by key, floats by bits (NaN equals NaN)."""
    if type(a) is not type(b):
        return [f"{path}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"]
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in json_diff(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}: {a!r:.200} vs {b!r:.200}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float):
        same = (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
        return [] if same else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def array_diff(name: str, a: np.ndarray | None, b: np.ndarray | None) -> list[str]:
    if a is None or b is None:
        return [] if a is None and b is None else [f"{name}: as_numpy {a!r} vs {b!r}"]
    if a.dtype != b.dtype or a.shape != b.shape:
        return [f"{name}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"]
    if a.dtype == object:
        same = [(type(x), x) for x in a.reshape(-1)] == [(type(x), x) for x in b.reshape(-1)]  # (str from JSON)
    else:
        same = a.tobytes() == b.tobytes()
    return [] if same else [f"{name}: values {a!r} != {b!r}"]


def assert_same(channel: str, spec: df.RequestSpec, got: dict[str, dict[str, Any]]) -> None:
    a, b = got["inferd"], got["triton"]
    diffs: list[str] = []
    if a["status"] != b["status"]:
        diffs.append(f"status {a['status']} != {b['status']}")
    else:
        diffs += json_diff(a.get("json"), b.get("json"))
        for key in ("binary", "content_type", "tail", "shm"):
            if a.get(key) != b.get(key):
                diffs.append(f"{key}: {a.get(key)!r:.300} != {b.get(key)!r:.300}")
        for name in sorted(set(a.get("arrays", {})) | set(b.get("arrays", {}))):
            diffs += array_diff(name, a.get("arrays", {}).get(name), b.get("arrays", {}).get(name))
    answers = "".join(f"\n{label}: {got[label].get('error') or got[label].get('json')!r:.600}" for label in LABELS)
    assert not diffs, f"{channel}: inferd and Triton differ for {spec!r}\n  " + "\n  ".join(diffs) + answers


# ---------------------------------------------------------------- the three ways a request is sent

def send_raw_http(c: Clients, spec: df.RequestSpec, shm: dw.ShmPlan | None) -> dict[str, Any]:
    body, headers = dw.http_body(spec, shm)
    r = c.raw.post(f"/v2/models/{spec.model}/infer", content=body, headers=headers)
    if r.status_code != 200:
        return {"status": r.status_code, "error": r.text}
    hlen = r.headers.get("inference-header-content-length")
    head = r.content[:int(hlen)] if hlen is not None else r.content
    return {"status": 200, "binary": hlen is not None, "content_type": r.headers.get("content-type"),
            "json": json.loads(head), "tail": r.content[len(head):]}


def _shm_outputs(spec: df.RequestSpec) -> set[str]:
    """Outputs written to shared memory: the answer names them without data (both servers)."""
    return {o.name for o in spec.outputs or () if o.shm}


def send_tritonclient_http(c: Clients, spec: df.RequestSpec, shm: dw.ShmPlan | None) -> dict[str, Any]:
    try:
        res = c.http.infer(spec.model, dw.client_inputs(httpclient, spec, shm),
                           outputs=dw.client_outputs(httpclient, spec, shm), request_id=spec.request_id or "",
                           parameters=spec.parameters or None)
    except InferenceServerException as exc:
        return {"status": exc.status(), "error": exc.message()}
    doc = res.get_response()
    arrays = {o["name"]: res.as_numpy(o["name"]) for o in doc["outputs"] if o["name"] not in _shm_outputs(spec)}
    return {"status": 200, "json": doc, "arrays": arrays}


def send_grpc(c: Clients, spec: df.RequestSpec, shm: dw.ShmPlan | None) -> dict[str, Any]:
    try:
        resp = c.grpc.ModelInfer(dw.grpc_request(service_pb2, spec, shm), timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        return {"status": exc.code().name, "error": exc.details()}
    res = grpcclient.InferResult(resp)
    arrays = {o.name: res.as_numpy(o.name) for o in resp.outputs if o.name not in _shm_outputs(spec)}
    return {"status": "OK", "json": MessageToDict(resp, preserving_proto_field_name=True), "arrays": arrays}


def send_tritonclient_grpc(c: Clients, spec: df.RequestSpec, shm: dw.ShmPlan | None) -> dict[str, Any]:
    try:
        res = c.grpc_client.infer(spec.model, dw.client_inputs(grpcclient, spec, shm),
                                  outputs=dw.client_outputs(grpcclient, spec, shm), request_id=spec.request_id or "",
                                  parameters=spec.parameters or None, client_timeout=TIMEOUT_S)
    except InferenceServerException as exc:
        return {"status": exc.status(), "error": exc.message()}
    resp = res.get_response()
    arrays = {o.name: res.as_numpy(o.name) for o in resp.outputs if o.name not in _shm_outputs(spec)}
    return {"status": "OK", "json": MessageToDict(resp, preserving_proto_field_name=True), "arrays": arrays}


CHANNELS = {"raw HTTP": send_raw_http, "tritonclient.http": send_tritonclient_http, "gRPC": send_grpc,
            "tritonclient.grpc": send_tritonclient_grpc}


def _shm_call(c: Clients, action: str, region: str, body: dict[str, Any] | None = None) -> None:
    r = c.raw.post(f"/v2/systemsharedmemory/region/{region}/{action}", json=body)
    assert r.status_code == 200, f"{action} of shared memory region {region} -> {r.status_code}: {r.text}"


def _unregister(c: Clients, region: str) -> None:
    """Triton holds a region a little after its answer was sent ("Cannot unregister shared memory region
    ..., it is currently in use", 500): it is asked again until it lets go."""
    def done() -> bool:
        r = c.raw.post(f"/v2/systemsharedmemory/region/{region}/unregister")
        if r.status_code != 200 and "currently in use" not in r.text:
            raise AssertionError(f"unregister of shared memory region {region} -> {r.status_code}: {r.text}")
        return r.status_code == 200

    c.wait_for(done, 10.0, f"shared memory region {region} unregistered")


def _register(clients: dict[str, Clients], spec: df.RequestSpec, shm: dw.ShmPlan,
              registered: list[tuple[Clients, str]]) -> None:
    """Make the request's segments and register them with both servers (the input one with both, each
    server's output one with it), noting in `registered` what to unregister."""
    shm.create(spec, list(LABELS))
    for label, c in clients.items():
        for region, seg in ((shm.region_in, shm.seg_in), (shm.region_out, shm.seg_out.get(label))):
            if seg is not None:
                _shm_call(c, "register", region, {"key": seg.key, "offset": 0, "byte_size": seg.size})
                registered.append((c, region))


def _release(registered: list[tuple[Clients, str]], shm: dw.ShmPlan | None) -> None:
    """Unregister the regions, and remove the segments whatever that answered."""
    try:
        for c, region in registered:
            _unregister(c, region)
    finally:
        if shm is not None:
            shm.close()


def run_everywhere(clients: dict[str, Clients], spec: df.RequestSpec) -> None:
    """Send `spec` each way to both servers (shared memory made and registered for it) and compare."""
    shm = dw.ShmPlan.layout(spec) if spec.uses_shm else None
    registered: list[tuple[Clients, str]] = []
    try:
        if shm is not None:
            _register(clients, spec, shm, registered)
        for channel, send in CHANNELS.items():
            got = {}
            for label in LABELS:
                if shm is not None:
                    shm.clear_outputs()
                got[label] = send(clients[label], spec, shm)
                if shm is not None and got[label]["status"] in (200, "OK"):
                    got[label]["shm"] = shm.read_outputs(label)
            assert_same(channel, spec, got)
    finally:
        _release(registered, shm)


# ---------------------------------------------------------------- the tests

def _maybe_seeded(test: Any) -> Any:
    return seed(int(SEED))(test) if SEED else test


def _with_explicit_examples(test: Any) -> Any:
    for spec in reversed(df.explicit_examples()):
        test = example(spec=spec)(test)
    return test


@_maybe_seeded
@SETTINGS
@_with_explicit_examples
@given(spec=df.requests())
def test_random_valid_requests_answer_as_triton(clients: dict[str, Clients], spec: df.RequestSpec) -> None:
    # (what the draw covered: --hypothesis-show-statistics lists these)
    event(f"model {spec.model}")
    for t in spec.inputs:
        event(f"{t.datatype} input as {t.encoding}")
    event("outputs listed" if spec.outputs is not None else "outputs by default")
    if any(o.shm for o in spec.outputs or ()):
        event("an output to shared memory")
    run_everywhere(clients, spec)


@_maybe_seeded
@settings(SETTINGS, max_examples=max(10, EXAMPLES // 3))
@given(case=df.invalid_requests())
def test_random_invalid_requests_get_the_status_triton_gives(clients: dict[str, Clients],
                                                            case: tuple[str, df.RequestSpec]) -> None:
    """A valid request with one thing wrong (datatype, rank, a missing or unknown input, batch size, an
    unknown output): the same status from both, over HTTP and gRPC (tritonclient refuses to send these)."""
    kind, spec = case
    event(kind)
    shm = dw.ShmPlan.layout(spec) if spec.uses_shm else None
    registered: list[tuple[Clients, str]] = []
    try:
        if shm is not None:
            _register(clients, spec, shm, registered)
        for channel, send in (("raw HTTP", send_raw_http), ("gRPC", send_grpc)):
            got = {label: send(clients[label], spec, shm) for label in LABELS}
            assert got["inferd"]["status"] == got["triton"]["status"], f"{channel}, {kind}: {spec!r}\n{got}"
            assert got["inferd"]["status"] not in (200, "OK"), f"{channel}, {kind}: {spec!r} was served: {got}"
    finally:
        _release(registered, shm)


# ---------------------------------------------------------------- invalid requests, and known differences

@pytest.fixture(scope="module")
def region(clients: dict[str, Clients]) -> Iterator[str]:
    """A 64-byte client region, registered with both servers as dc.REGION."""
    seg = dw.Segment(dc.REGION_SIZE)
    try:
        for c in clients.values():
            _shm_call(c, "register", dc.REGION, {"key": seg.key, "offset": 0, "byte_size": dc.REGION_SIZE})
        yield dc.REGION
        for c in clients.values():
            _unregister(c, dc.REGION)
    finally:
        seg.close()


def _post(c: Clients, model: str, version: str, request: tuple[bytes, dict[str, str]]) -> dict[str, Any]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    body, headers = request
    r = c.raw.post(path, content=body, headers=headers)
    out: dict[str, Any] = {"status": r.status_code, "error": r.text[:300]}
    if r.status_code == 200 and "inference-header-content-length" not in r.headers:
        try:
            out["json"] = json.loads(r.content)
        except ValueError:  # (Triton's answer with raw non-UTF-8 bytes in a string)
            out["json"] = repr(r.content)
    return out


CASES = dc.cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_requests_get_the_status_triton_gives(clients: dict[str, Clients], region: str,
                                                     case: dc.Case) -> None:
    """Statuses (and the answer, where there is one) agree; the messages may differ in wording."""
    if case.http is not None:
        got = {label: _post(clients[label], case.model, case.version, case.http) for label in LABELS}
        assert got["inferd"]["status"] == got["triton"]["status"], f"HTTP {case.name}: {got}"
        assert not json_diff(got["inferd"].get("json"), got["triton"].get("json")), f"HTTP {case.name}: {got}"
    if case.grpc is not None:
        grpc_got = {}
        for label in LABELS:
            try:
                resp = clients[label].grpc.ModelInfer(case.grpc, timeout=TIMEOUT_S)
                grpc_got[label] = {"status": "OK", "json": MessageToDict(resp, preserving_proto_field_name=True)}
            except grpc.RpcError as exc:
                grpc_got[label] = {"status": exc.code().name, "error": exc.details()}
        assert grpc_got["inferd"]["status"] == grpc_got["triton"]["status"], f"gRPC {case.name}: {grpc_got}"
        assert not json_diff(grpc_got["inferd"].get("json"), grpc_got["triton"].get("json")), grpc_got


KNOWN = dc.known_differences()


@pytest.mark.parametrize("name,model,request_,inferd_status,triton_status", KNOWN, ids=[k[0] for k in KNOWN])
def test_known_differences(clients: dict[str, Clients], region: str, name: str, model: str,
                           request_: tuple[bytes, dict[str, str]], inferd_status: int, triton_status: int) -> None:
    """Where Triton 2.51's answer is a defect of its own and inferd answers otherwise (the module's docstring
    and differential_cases.py say why, case by case). Should either side change, this fails."""
    got = {label: _post(clients[label], model, "", request_) for label in LABELS}
    assert (got["inferd"]["status"], got["triton"]["status"]) == (inferd_status, triton_status), got


def test_known_value_differences(clients: dict[str, Clients]) -> None:
    """Two answers that differ in a value, inferd's being the exact one."""
    # an id with a NUL: Triton cuts it there (a C string's end); inferd echoes it whole
    body = json.dumps({"id": "a\u0000b", "inputs": [{"name": "INPUT_INT8", "datatype": "INT8", "shape": [1],
                                                     "data": [1]}]}).encode()
    ids = {label: clients[label].raw.post(f"/v2/models/{df.IDENTITY_NOBATCH}/infer", content=body).json()["id"]
           for label in LABELS}
    assert ids == {"inferd": "a\u0000b", "triton": "a"}
    # a JSON FP64 outside rapidjson's fast path: Triton reads it one ULP off; inferd reads it correctly rounded
    value = -5.6742384734777775e-96
    body = json.dumps({"inputs": [{"name": "INPUT_FP64", "datatype": "FP64", "shape": [1], "data": [value]}],
                       "outputs": [{"name": "OUTPUT_FP64", "parameters": {"binary_data": True}}]}).encode()
    tails = {label: clients[label].raw.post(f"/v2/models/{df.IDENTITY_NOBATCH}/infer", content=body).content[-8:]
             for label in LABELS}
    assert tails["inferd"] == struct.pack("<d", value)
    assert tails["triton"] != tails["inferd"]
    assert abs(struct.unpack("<q", tails["triton"])[0] - struct.unpack("<q", tails["inferd"])[0]) == 1
