"""Request tracing (issue 24): trace files in Triton 2.51's format — checked by the same reader against a
trace file the real Triton 2.51 wrote here (tests/fixtures/triton_2.51_trace_timestamps.json) — with rate,
count, log_frequency rotation, TENSORS and ensemble children; and OpenTelemetry spans received by a real
OTLP/HTTP server started by the test, decoding the protobuf payloads, with W3C traceparent continued from
HTTP headers and gRPC metadata."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import REPO_ROOT, wait_for

# trace files the real Triton 2.51 wrote on this machine (tools/triton_reference.sh): add_sub over HTTP and
# gRPC at TIMESTAMPS; an ensemble over add_sub at TIMESTAMPS + TENSORS
TRITON_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "triton_2.51_trace_timestamps.json"
TRITON_ENSEMBLE_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "triton_2.51_trace_ensemble_tensors.json"
COMPUTE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
HEAD_KEYS = {"id", "model_name", "model_version", "request_id"}


def read_traces(records: list[dict]) -> dict[int, dict]:
    """Triton's trace records grouped per trace id, as Triton's trace_summary.py groups them, checking
    every record has one of the three shapes Triton writes (head, timestamp, tensor)."""
    traces: dict[int, dict] = {}
    for rec in records:
        t = traces.setdefault(rec["id"], {"timestamps": {}, "tensors": []})
        if "model_name" in rec:
            assert set(rec) in (HEAD_KEYS, HEAD_KEYS | {"parent_id"}), rec
            assert isinstance(rec["model_version"], int) and isinstance(rec["request_id"], str)
            t.update(rec)
        elif "timestamps" in rec:
            assert set(rec) == {"id", "timestamps"} and len(rec["timestamps"]) == 1, rec
            (stamp,) = rec["timestamps"]
            assert set(stamp) == {"name", "ns"} and isinstance(stamp["ns"], int), rec
            t["timestamps"][stamp["name"]] = stamp["ns"]
        else:
            assert set(rec) == {"id", "activity", "tensor"}, rec
            assert set(rec["tensor"]) == {"name", "data", "shape", "dtype"}, rec
            t["tensors"].append(rec)
    for trace_id, t in traces.items():
        assert "model_name" in t, f"trace {trace_id} has no model record"
        ts = t["timestamps"]
        # an ensemble's own trace has no compute (its steps do); every other has all of Triton's
        order = ("REQUEST_START", "QUEUE_START", *(COMPUTE if "COMPUTE_START" in ts else ()), "REQUEST_END")
        stamps = [ts[name] for name in order]
        assert stamps == sorted(stamps), (trace_id, ts)
        if "parent_id" in t:
            assert t["parent_id"] in traces and "INFER_RESPONSE_COMPLETE" not in ts
        else:
            assert "INFER_RESPONSE_COMPLETE" in ts
    return traces


def test_the_reader_accepts_real_triton_traces():
    traces = read_traces(json.loads(TRITON_FIXTURE.read_text()))
    assert {t["request_id"] for t in traces.values()} == {"r1", "g1"}
    traces = read_traces(json.loads(TRITON_ENSEMBLE_FIXTURE.read_text()))
    ens, step = sorted(traces.values(), key=lambda t: t["id"])
    assert step["parent_id"] == ens["id"] and "COMPUTE_START" not in ens["timestamps"]
    assert [r["activity"] for r in step["tensors"]] == ["TENSOR_QUEUE_INPUT"] * 2 + ["TENSOR_BACKEND_OUTPUT"]


def _add_sub_inputs(mod, n: int = 16):
    a = np.arange(n, dtype=np.float32)
    inputs = [mod.InferInput("INPUT0", [n], "FP32"), mod.InferInput("INPUT1", [n], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones(n, np.float32))
    return inputs


def _stop(server) -> None:
    assert server.stop() == 0, server.log_tail()


def test_trace_file_as_triton_writes_it(server_factory, tmp_path):
    path = tmp_path / "trace.json"
    server = server_factory(["add_sub"], extra_args=[
        "--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1"])
    assert "trace" in server.http_client().get_server_metadata()["extensions"]
    server.http_client().infer("add_sub", _add_sub_inputs(httpclient), request_id="h1")
    server.grpc_client().infer("add_sub", _add_sub_inputs(grpcclient), request_id="g1")
    _stop(server)
    traces = read_traces(json.loads(path.read_text()))
    assert sorted((t["model_name"], t["model_version"], t["request_id"]) for t in traces.values()) == [
        ("add_sub", 1, "g1"), ("add_sub", 1, "h1")]
    assert all(not t["tensors"] and "parent_id" not in t for t in traces.values())


def test_rate_count_rotation_and_tensors(server_factory, tmp_path):
    path = tmp_path / "t.json"
    server = server_factory(["add_sub"], extra_args=[
        "--trace-config", f"triton,file={path}", "--trace-config", "triton,log-frequency=2",
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "level=TENSORS", "--trace-config", "rate=2"])
    http = server.http_client()
    for i in range(8):  # every 2nd traced: 4 traces, 2 per file
        http.infer("add_sub", _add_sub_inputs(httpclient), request_id=f"r{i}")
    wait_for(lambda: (tmp_path / "t.json.1").exists(), 30, "the second rotated trace file")
    # trace_count counts down as traces are taken; at 0 nothing more is traced
    assert http.update_trace_settings(settings={"trace_count": "1", "trace_rate": "1"})["trace_count"] == "1"
    for i in range(3):
        http.infer("add_sub", _add_sub_inputs(httpclient), request_id=f"c{i}")
    assert http.get_trace_settings()["trace_count"] == "0"
    _stop(server)
    files = sorted(tmp_path.glob("t.json.*"))
    assert [f.name for f in files] == ["t.json.0", "t.json.1", "t.json.2"]
    per_file = [read_traces(json.loads(f.read_text())) for f in files]
    assert [sorted(t["request_id"] for t in traces.values()) for traces in per_file] == [
        ["r1", "r3"], ["r5", "r7"], ["c0"]]
    tensors = list(per_file[0].values())[0]["tensors"]
    got = {(r["activity"], r["tensor"]["name"]): r["tensor"] for r in tensors}
    assert got[("TENSOR_QUEUE_INPUT", "INPUT0")] == {"name": "INPUT0", "data": ",".join(map(str, range(16))),
                                                     "shape": "16", "dtype": "FP32"}
    assert got[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == ",".join(str(i + 1) for i in range(16))


def test_one_models_settings_trace_that_model_only(server_factory, tmp_path):
    path = tmp_path / "x.json"
    server = server_factory({"add_sub": "add_sub", "other": "add_sub"},
                            extra_args=["--trace-config", f"triton,file={path}"])
    http = server.http_client()
    got = http.update_trace_settings("add_sub", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert got["trace_level"] == ["TIMESTAMPS"] and got["trace_file"] == str(path)
    for model in ("add_sub", "other", "add_sub"):
        http.infer(model, _add_sub_inputs(httpclient), request_id=model)
    _stop(server)
    traces = read_traces(json.loads(path.read_text()))
    assert [t["request_id"] for t in traces.values()] == ["add_sub", "add_sub"]


def test_a_level_without_a_file_starts_and_traces_nothing(server_factory):
    """As tritonserver 2.51 (checked here): it starts, shows the level, refuses updates for want of a file."""
    server = server_factory(["add_sub"], extra_args=["--trace-config", "level=TIMESTAMPS"])
    http = server.http_client()
    assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
    http.infer("add_sub", _add_sub_inputs(httpclient))
    with pytest.raises(Exception, match="trace file name is not given"):
        http.update_trace_settings(settings={"trace_rate": "5"})
    assert "no traces are written" in server.log()


ENSEMBLE = '''name: "ens"
platform: "ensemble"
input [ { name: "A" data_type: TYPE_FP32 dims: [16] }, { name: "B" data_type: TYPE_FP32 dims: [16] } ]
output [ { name: "S" data_type: TYPE_FP32 dims: [16] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "S" } }
] }
'''


def _ensemble_repo(server_factory) -> Path:
    repo = server_factory.make_repo(["add_sub"])
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    return repo


def _ens_inputs(mod):
    inputs = [mod.InferInput("A", [16], "FP32"), mod.InferInput("B", [16], "FP32")]
    for t in inputs:
        t.set_data_from_numpy(np.ones(16, np.float32))
    return inputs


def test_ensemble_steps_are_children_of_their_request(server_factory, tmp_path):
    path = tmp_path / "e.json"
    server = server_factory(["add_sub", "ens"], repo=_ensemble_repo(server_factory), extra_args=[
        "--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"])
    server.http_client().infer("ens", _ens_inputs(httpclient), request_id="e1")
    _stop(server)
    records = json.loads(path.read_text())
    read_traces(records)
    assert [r["model_name"] for r in _heads(records)] == ["add_sub", "ens"]  # as Triton: the step first
    traces = {t["model_name"]: t for t in (dict(v) for v in _heads(records))}
    assert traces["add_sub"]["parent_id"] == traces["ens"]["id"] and "parent_id" not in traces["ens"]
    stamps = {r["id"]: {} for r in records}
    for r in records:
        for s in r.get("timestamps", ()):
            stamps[r["id"]][s["name"]] = s["ns"]
    child, parent = stamps[traces["add_sub"]["id"]], stamps[traces["ens"]["id"]]
    assert parent["REQUEST_START"] <= child["REQUEST_START"] <= child["COMPUTE_END"] <= parent["REQUEST_END"]


def _heads(records):
    return [r for r in records if "model_name" in r]


# ---- OpenTelemetry ----
class _Receiver:
    """An OTLP/HTTP trace receiver: decodes each ExportTraceServiceRequest into its spans."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list = []
        self.resources: list[dict] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                msg = ExportTraceServiceRequest()
                msg.ParseFromString(body)
                receiver.paths.append(self.path)
                for rs in msg.resource_spans:
                    receiver.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    pytest.importorskip("opentelemetry.sdk")
    r = _Receiver()
    yield r
    r.close()


def _attrs(span) -> dict:
    return {a.key: (a.value.string_value or a.value.int_value) for a in span.attributes}


def test_opentelemetry_spans_continue_the_clients_trace(server_factory, receiver):
    """The spans are Triton 2.51's (recorded from it here with this receiver): InferRequest > <model> >
    compute, ensemble steps as model spans under their ensemble's; inferd adds a queue span."""
    server = server_factory(["add_sub", "ens"], repo=_ensemble_repo(server_factory), extra_args=[
        "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
        "--trace-config", f"opentelemetry,url=127.0.0.1:{receiver.port}/v1/traces",
        "--trace-config", "opentelemetry,resource=service.name=inferd-test",
        "--trace-config", "opentelemetry,bsp_schedule_delay=50"])
    assert server.http_client().get_trace_settings() == {  # as Triton 2.51 shows them in this mode
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "trace_mode": "opentelemetry",
        "url": f"127.0.0.1:{receiver.port}/v1/traces", "bsp_schedule_delay": "50",
        "bsp_max_export_batch_size": "512", "bsp_max_queue_size": "2048"}
    http_parent = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    grpc_parent = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    server.http_client().infer("add_sub", _add_sub_inputs(httpclient), request_id="h1",
                               headers={"traceparent": "00-%s-%s-01" % http_parent})
    server.grpc_client().infer("add_sub", _add_sub_inputs(grpcclient), request_id="g1",
                               headers={"traceparent": "00-%s-%s-01" % grpc_parent})
    server.http_client().infer("ens", _ens_inputs(httpclient), request_id="e1")
    # add_sub: InferRequest, add_sub, queue, compute; the ensemble: InferRequest, ens, and add_sub's three
    wait_for(lambda: len(receiver.spans) >= 4 + 4 + 5, 30, "the spans of 3 requests at the receiver")
    assert set(receiver.paths) == {"/v1/traces"}
    assert receiver.resources[0]["service.name"] == "inferd-test"
    by_id = {s.span_id: s for s in receiver.spans}

    def kids(span) -> dict:
        return {s.name: s for s in receiver.spans if s.parent_span_id == span.span_id}

    models = {_attrs(s)["triton.request_id"] + "/" + s.name: s for s in receiver.spans if s.name in ("add_sub", "ens")}
    for rid, (trace_hex, parent_hex) in (("h1", http_parent), ("g1", grpc_parent)):
        span = models[rid + "/add_sub"]
        top = by_id[span.parent_span_id]
        assert top.name == "InferRequest" and {e.name for e in top.events} == {"INFER_RESPONSE_COMPLETE"}
        assert top.trace_id.hex() == trace_hex and top.parent_span_id.hex() == parent_hex
        assert span.trace_id.hex() == trace_hex
        assert [e.name for e in span.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        attrs = _attrs(span)
        assert (attrs["triton.model_name"], attrs["triton.model_version"], attrs["triton.trace_parent_id"]) == (
            "add_sub", 1, 0)
        k = kids(span)
        assert set(k) == {"queue", "compute"}
        assert top.start_time_unix_nano <= span.start_time_unix_nano <= k["queue"].start_time_unix_nano \
            <= k["queue"].end_time_unix_nano <= k["compute"].start_time_unix_nano \
            <= k["compute"].end_time_unix_nano <= span.end_time_unix_nano <= top.end_time_unix_nano
        assert [e.name for e in k["compute"].events] == [
            "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    ens = models["e1/ens"]  # no traceparent: a trace of its own, its step a model span under it
    top = by_id[ens.parent_span_id]
    assert top.name == "InferRequest" and top.parent_span_id == b""
    assert top.trace_id.hex() not in (http_parent[0], grpc_parent[0])
    step = models["e1/add_sub"]
    assert step.parent_span_id == ens.span_id and step.trace_id == ens.trace_id
    assert _attrs(step)["triton.trace_parent_id"] == _attrs(ens)["triton.trace_id"]
    assert set(kids(step)) == {"queue", "compute"} and set(kids(ens)) == {"add_sub"}


BLS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            inputs = [pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)]
            # traced with its caller (trace=request.trace()), and a call that is not (as Triton)
            traced = pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs,
                                               requested_output_names=["OUTPUT0"], trace=request.trace()).exec()
            pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs,
                                      requested_output_names=["OUTPUT1"]).exec()
            out = pb_utils.get_output_tensor_by_name(traced, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
'''


def test_bls_calls_given_the_callers_trace_are_its_children(server_factory, tmp_path):
    repo = server_factory.make_repo(["add_sub"])
    (repo / "bls_caller" / "1").mkdir(parents=True)
    (repo / "bls_caller" / "1" / "model.py").write_text(BLS_MODEL)
    (repo / "bls_caller" / "config.pbtxt").write_text(
        (repo / "add_sub" / "config.pbtxt").read_text().replace('name: "add_sub"', 'name: "bls_caller"'))
    path = tmp_path / "b.json"
    server = server_factory(["add_sub", "bls_caller"], repo=repo, extra_args=[
        "--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"])
    result = server.http_client().infer("bls_caller", _add_sub_inputs(httpclient), request_id="b1")
    assert result.as_numpy("OUTPUT0").tolist() == [i + 1.0 for i in range(16)]
    _stop(server)
    traces = read_traces(json.loads(path.read_text()))
    by_model = sorted((t["model_name"], t.get("parent_id")) for t in traces.values())
    root = next(t["id"] for t in traces.values() if t["model_name"] == "bls_caller")
    assert by_model == [("add_sub", root), ("bls_caller", None)]  # the untraced call left no trace


def test_a_decoupled_stream_request_is_traced_with_the_streams_traceparent(server_factory, receiver):
    import queue

    server = server_factory(["decoupled_repeat"], extra_args=[
        "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
        "--trace-config", f"opentelemetry,url=http://127.0.0.1:{receiver.port}/v1/traces",
        "--trace-config", "opentelemetry,bsp_schedule_delay=50"])
    parent = ("5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8")
    events: queue.Queue = queue.Queue()
    client = server.grpc_client()
    client.start_stream(callback=lambda result, error: events.put((result, error)),
                        headers={"traceparent": "00-%s-%s-01" % parent})
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], dtype=np.int32))
    client.async_stream_infer("decoupled_repeat", [tensor], request_id="s1")
    for _ in range(3):
        result, error = events.get(timeout=30)
        assert error is None
    client.stop_stream()
    wait_for(lambda: any(s.name == "compute" for s in receiver.spans), 30, "the stream request's spans")
    (span,) = [s for s in receiver.spans if s.name == "decoupled_repeat"]
    top = next(s for s in receiver.spans if s.span_id == span.parent_span_id)
    assert (top.trace_id.hex(), top.parent_span_id.hex()) == parent and top.name == "InferRequest"
    assert _attrs(span)["triton.request_id"] == "s1" and span.end_time_unix_nano >= span.start_time_unix_nano
    (compute,) = [s for s in receiver.spans if s.name == "compute"]
    assert compute.parent_span_id == span.span_id and compute.end_time_unix_nano <= span.end_time_unix_nano
