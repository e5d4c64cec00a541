"""Batches sent by columns (ExecuteColumns / ExecuteResultColumns) give the model and the client exactly
what the request-by-request Execute / ExecuteResult give, and only alike batches take that path.

The supervisor's packer and result reader and the worker's runtime run for real here, joined in process
(the header bytes each side writes are what the other side decodes); tests/e2e exercise the same paths
through worker processes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from unittest import mock

import numpy as np
import pytest
from inferd.supervisor.inference.types import InferRequest, InferResponse, RequestedOutput, Tensor
from inferd.supervisor.instances import results
from inferd.supervisor.instances.packing import InputPacker
from inferd.worker import columns as worker_columns
from inferd.worker import tensors
from inferd.worker.backends.base import ModelSpec, Response
from inferd.worker.backends.base import Tensor as WorkerTensor
from inferd.worker.channel import header_loads
from inferd.worker.message_loop import Runtime
from inferd.worker.wire import messages as m

CONFIG: dict[str, Any] = {"name": "m", "max_batch_size": 8,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]},
                    {"name": "N", "data_type": "TYPE_INT64", "dims": [1]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]},
                     {"name": "S", "data_type": "TYPE_INT64", "dims": [1]}]}


class SentToSupervisor:
    """The worker's channel: keeps the header bytes and frames it would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list[Any]]] = []

    def send(self, message: Any, frames: Any = ()) -> None:
        self.sent.append((m.encode_header(message), list(frames)))

    def send_encoded(self, header: bytes, frames: Any = ()) -> None:
        self.sent.append((header, [memoryview(bytes(f)) for f in frames]))

    def read_ahead(self) -> list[Any]:
        return []

    def take_pending(self, keep: Any) -> None:
        pass


class Doubling:
    """Y = 2 * X, S = the request's N; `vary` makes request i's Y one element longer (unalike outputs)."""

    name = "fake"

    def __init__(self) -> None:
        self.seen: list[list[list[tuple[str, str, np.ndarray]]]] = []
        self.vary = False
        self.strided = False
        self.params: dict[str, Any] = {}

    def execute(self, requests: list[Any]) -> list[Response]:
        self.seen.append([[(t.name, t.datatype, t.array.copy()) for t in r.inputs] for r in requests])
        out = []
        for i, r in enumerate(requests):
            x = r.inputs[0].array
            y = np.concatenate([x * 2, x[:, :1]], axis=1) if self.vary and i % 2 else x * 2
            if self.strided and i % 2:  # the same values, not C-contiguous: copied, still by columns
                y = np.stack([y, -y], axis=2)[..., 0]
            out.append(Response([WorkerTensor("Y", "FP32", y), WorkerTensor("S", "INT64", r.inputs[1].array)],
                                parameters=dict(self.params)))
        return out


def runtime() -> tuple[Runtime, SentToSupervisor, Doubling]:
    channel = SentToSupervisor()
    rt = Runtime(channel)  # type: ignore[arg-type]
    backend = Doubling()
    rt._backend = backend  # type: ignore[assignment]
    rt._spec = ModelSpec("m", "/x", "1", json.dumps(CONFIG), "fake")
    rt._results.configure(rt._spec)
    return rt, channel, backend


def request(i: int, **kw: Any) -> InferRequest:
    req = InferRequest("m", id=kw.pop("id", f"r{i}"), **kw)
    req.inputs = [Tensor("X", "FP32", [1, 2], np.array([[i, i + 0.5]], "<f4").tobytes()),
                  Tensor("N", "INT64", [1, 1], np.array([[i * 10]], "<i8").tobytes())]
    return req


def round_trip(requests: list[InferRequest], packer: InputPacker | None = None,
               prepare: Any = None) -> tuple[Any, Any, Any, Doubling]:
    """Pack, run in the worker, read the result: (Packed, result message, BatchResult, backend)."""
    packer = packer or InputPacker(None)
    packed = packer.pack(requests)
    header = packed.header(1)
    rt, channel, backend = runtime()
    if prepare is not None:
        prepare(rt, backend)
    message = m.decode_header(header, header_loads)
    rt._handlers[type(message)](message, [memoryview(f) for f in packed.frames])
    (raw, frames), = channel.sent
    msg, data = results.decode([raw, *frames])
    return packed, msg, results.batch_result(requests, packed.ids, msg, data, "1"), backend


def by_items(requests: list[InferRequest]) -> tuple[Any, Any, Doubling]:
    packer = InputPacker(None)
    packer._pack_columns = lambda requests: None  # type: ignore[method-assign]
    with mock.patch.object(worker_columns, "output_columns", lambda *a: None):  # results by items too
        packed, msg, result, backend = round_trip(requests, packer)
    assert packed.columns is None and type(msg) is m.ExecuteResult
    return msg, result, backend


def answers(result: Any) -> list[Any]:
    return [(r.id, r.model_version, r.parameters,
             [(t.name, t.datatype, list(t.shape), bytes(t.data)) for t in r.outputs]) if hasattr(r, "outputs")
            else (r.code, r.message) for r in result.responses]


def test_alike_batch_goes_by_columns_both_ways_and_matches_the_item_path():
    requests = [request(i) for i in range(5)]
    packed, msg, result, backend = round_trip(requests)
    assert packed.columns is not None and len(packed.frames) == 2  # one frame per input
    assert type(msg) is m.ExecuteResultColumns and len(msg.outputs) == 2
    item_msg, item_result, item_backend = by_items(requests)
    # the model saw the same tensors, and the clients get the same answers
    assert [[(n, d, a.tolist(), a.shape) for n, d, a in r] for r in backend.seen[0]] == \
        [[(n, d, a.tolist(), a.shape) for n, d, a in r] for r in item_backend.seen[0]]
    assert answers(result) == answers(item_result)
    assert answers(result)[3] == ("r3", "1", {}, [("Y", "FP32", [1, 2], np.array([[6, 7]], "<f4").tobytes()),
                                                  ("S", "INT64", [1, 1], np.array([[30]], "<i8").tobytes())])
    assert (result.compute_input_ns, result.compute_infer_ns) != (0, 0)


def test_outputs_the_first_request_did_not_need_converted_still_get_converted_in_later_ones():
    requests = [request(i) for i in range(4)]
    _, msg, result, _ = round_trip(requests, prepare=lambda rt, backend: setattr(backend, "strided", True))
    assert type(msg) is m.ExecuteResultColumns
    assert answers(result) == answers(by_items(requests)[1])


def test_columns_keep_client_ids_and_requested_outputs():
    requests = [request(i, id="" if i != 2 else "only-me", outputs=[RequestedOutput("S")]) for i in range(3)]
    packed, msg, result, _ = round_trip(requests)
    header = json.loads(packed.header(1))
    assert header["ids"] == ["", "", "only-me"] and header["requested_outputs"] == ["S"]
    assert [r.id for r in result.responses] == ["", "", "only-me"]
    assert [[t.name for t in r.outputs] for r in result.responses] == [["S"]] * 3
    no_ids = [request(i, id="") for i in range(3)]
    assert "ids" not in json.loads(round_trip(no_ids)[0].header(1))  # all empty: left out


def unlike(kind: str) -> list[InferRequest]:
    requests = [request(i) for i in range(3)]
    last = requests[-1]
    if kind == "shape":
        last.inputs[0] = Tensor("X", "FP32", [2, 2], bytes(16))
    elif kind == "parameters":
        last.parameters = {"p": 1}
    elif kind == "sequence":
        last.correlation_id, last.flags = 7, 1
    elif kind == "timeout":
        last.timeout_us = 100
    elif kind == "outputs":
        last.outputs = [RequestedOutput("Y")]
    elif kind == "names":
        last.inputs.reverse()
    elif kind == "bytes":
        for req in requests:
            req.inputs[1] = Tensor("N", "BYTES", [1, 1], b"\x01\x00\x00\x00a")
    elif kind == "size":  # a tensor whose bytes do not fit its shape is never split by columns
        last.inputs[0] = Tensor("X", "FP32", [1, 2], bytes(12))
    return requests


@pytest.mark.parametrize("kind", ["shape", "parameters", "sequence", "timeout", "outputs", "names", "bytes",
                                  "size"])
def test_unlike_requests_go_request_by_request(kind):
    assert InputPacker(None).pack(unlike(kind)).columns is None


def test_a_single_request_and_large_or_shared_inputs_go_request_by_request():
    assert InputPacker(None).pack([request(0)]).columns is None
    big = [request(i) for i in range(2)]
    for req in big:
        req.inputs[0] = Tensor("X", "FP32", [1, 1 << 14], bytes(1 << 16))
    assert InputPacker(None).pack(big).columns is None
    shared = [request(i) for i in range(2)]
    shared[0].inputs[0].shm_ref = ("inferd_1_w0", 0)
    assert InputPacker(None).pack(shared).columns is None


@pytest.mark.parametrize("change", ["vary", "params", "error"])
def test_unalike_results_go_back_request_by_request(change):
    requests = [request(i) for i in range(4)]

    def prepare(rt: Runtime, backend: Doubling) -> None:
        if change == "vary":
            backend.vary = True
            rt._results.configure(ModelSpec("m", "/x", "1", json.dumps(dict(CONFIG, output=[
                {"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}, CONFIG["output"][1]])), "fake"))
        elif change == "params":
            backend.params = {"k": "v"}
        else:  # S declared INT32: every response fails the output check
            rt._results.configure(ModelSpec("m", "/x", "1", json.dumps(dict(CONFIG, output=[
                CONFIG["output"][0], {"name": "S", "data_type": "TYPE_INT32", "dims": [1]}])), "fake"))

    packed, msg, result, _ = round_trip(requests, prepare=prepare)
    assert packed.columns is not None and type(msg) is m.ExecuteResult
    if change == "vary":
        assert [list(r.outputs[0].shape) for r in result.responses] == [[1, 2], [1, 3], [1, 2], [1, 3]]
    elif change == "params":
        assert all(r.parameters == {"k": "v"} for r in result.responses)
    else:
        assert all("INT64" in r.message for r in result.responses)


def test_a_cancelled_request_of_a_column_batch_is_not_run():
    requests = [request(i) for i in range(3)]
    packed = InputPacker(None).pack(requests)
    rt, channel, backend = runtime()
    rt._cancelled = {packed.ids[1]}
    message = m.decode_header(packed.header(4), header_loads)
    rt._on_execute_columns(message, [memoryview(f) for f in packed.frames])
    (raw, frames), = channel.sent
    result = results.batch_result(requests, packed.ids, results.decode([raw, *frames])[0], frames, "1")
    assert len(backend.seen[0]) == 2
    assert result.responses[1].code.name == "CANCELLED"
    assert [len(r.outputs) for r in (result.responses[0], result.responses[2])] == [2, 2]


def test_a_column_frame_of_the_wrong_size_fails_every_request_of_the_batch():
    requests = [request(i) for i in range(3)]
    packed = InputPacker(None).pack(requests)
    rt, channel, backend = runtime()
    message = m.decode_header(packed.header(4), header_loads)
    rt._on_execute_columns(message, [memoryview(packed.frames[0][:-4]), memoryview(packed.frames[1])])
    (raw, frames), = channel.sent
    result = results.batch_result(requests, packed.ids, results.decode([raw, *frames])[0], frames, "1")
    assert not backend.seen
    assert all(r.code.name == "INTERNAL" and "input column 'X'" in r.message for r in result.responses)


def test_malformed_column_messages_are_refused():
    rt, _, _ = runtime()
    bad = m.ExecuteColumns(1, [1, "2"], [])  # type: ignore[list-item]
    with pytest.raises(m.ProtocolError):
        rt._on_execute_columns(bad, [])
    requests = [request(i) for i in range(2)]
    packed, msg, _, _ = round_trip(requests)
    frames = [memoryview(bytes(8)), memoryview(bytes(16))]
    column = msg.outputs[0]
    cases = [dataclasses.replace(msg, request_ids=list(reversed(packed.ids))),
             dataclasses.replace(msg, outputs=[dataclasses.replace(column, datatype="BYTES")]),
             dataclasses.replace(msg, outputs=[dataclasses.replace(column, frame=5)]),
             dataclasses.replace(msg, outputs=[dataclasses.replace(column, shape=[1, -2])]),
             dataclasses.replace(msg, outputs=[dataclasses.replace(column, shape=[1, 3])])]  # frame too short
    for case in cases:
        with pytest.raises(ValueError):
            results.batch_result(requests, packed.ids, case, frames, "1")


def test_column_headers_decode_to_their_messages():
    header = m.execute_result_columns_header(3, [5, 6], [("na\u00efve \"y\"", "FP32", (1, 2)), ("S", "INT64", ())],
                                             1, 2, 3)
    assert m.decode_header(header) == m.ExecuteResultColumns(
        3, [5, 6], [m.TensorColumn("na\u00efve \"y\"", "FP32", [1, 2], 0), m.TensorColumn("S", "INT64", [], 1)],
        1, 2, 3)
    packed = InputPacker(None).pack([request(i) for i in range(2)])
    packed.forget = ["gone"]
    decoded = m.decode_header(packed.header(9), header_loads)
    assert decoded == m.ExecuteColumns(9, packed.ids, [m.TensorColumn("X", "FP32", [1, 2], 0),
                                                       m.TensorColumn("N", "INT64", [1, 1], 1)],
                                       ["r0", "r1"], [], ["gone"])


def test_one_output_per_request_goes_by_columns_only_when_every_request_wanted_it():
    """The one-output shortcut of output_columns keeps the request-by-request rule: a request whose
    requested outputs leave out the output it got sends the batch request by request."""
    specs = tensors.output_specs(CONFIG)
    y = np.array([[1, 2]], "<f4")

    def run(wanted: list[list[str]]) -> Any:
        reqs = [worker_columns.Request(i, "", [], w, "{}", 0, 0, 0, None) for i, w in enumerate(wanted)]
        results = [Response([WorkerTensor("Y", "FP32", y.copy())]) for _ in wanted]
        return worker_columns.output_columns(reqs, results, specs, ["Y", "S"], "m")

    layout, frames = run([["Y"]] * 3)
    assert layout == [("Y", "FP32", (1, 2))] and frames == [y.tobytes() * 3]
    assert run([["Y"], ["S"], ["Y"]]) is None


def test_one_output_columns_read_as_the_responses_init_makes():
    """results' one-output reader builds its InferResponses and Tensors without their __init__: every field
    is set, as __init__ sets it, and no two responses share a list or dict."""
    requests = [request(i, outputs=[RequestedOutput("Y")]) for i in range(3)]
    _, msg, result, _ = round_trip(requests)
    assert type(msg) is m.ExecuteResultColumns and len(msg.outputs) == 1
    for req, got in zip(requests, result.responses):
        t = got.outputs[0]
        made = InferResponse(req.model_name, "1", req.id, [Tensor(t.name, t.datatype, [1, 2], bytes(t.data))], {})
        assert [getattr(got, f.name) for f in dataclasses.fields(InferResponse)] == \
            [getattr(made, f.name) for f in dataclasses.fields(InferResponse)]
        assert [getattr(t, f.name) for f in dataclasses.fields(Tensor)] == \
            [getattr(made.outputs[0], f.name) for f in dataclasses.fields(Tensor)]
    first, second = result.responses[0], result.responses[1]
    assert first.parameters is not second.parameters and first.outputs[0].shape is not second.outputs[0].shape
    assert first.outputs[0].parameters is not second.outputs[0].parameters


@pytest.mark.parametrize("change", [None, "extra field", "column field", "no batch id", "outputs not a list"])
def test_the_reader_decodes_column_results_as_decode_does(change):
    header = json.loads(m.execute_result_columns_header(3, [5, 6], [("Y", "FP32", (1, 2))], 1, 2, 3))
    if change == "extra field":
        header["extra"] = 1
    elif change == "column field":
        header["outputs"][0]["extra"] = 1
    elif change == "no batch id":
        del header["batch_id"]
    elif change == "outputs not a list":
        header["outputs"] = {"a": 1}
    raw = json.dumps(header).encode()
    frames = [raw, memoryview(bytes(16))]
    if change is None:
        assert results.read(frames)[0] == m.decode(frames)[0]
        return
    with pytest.raises(m.ProtocolError) as expected:
        m.decode(frames)
    with pytest.raises(m.ProtocolError) as got:
        results.read(frames)
    assert str(got.value) == str(expected.value)
