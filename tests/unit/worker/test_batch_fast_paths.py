"""The worker's short paths for a batch sent by columns hold to the general ones: the objects built without
their __init__ (backends.base.requests_by_columns, python_plain.plain_results) are the objects __init__
makes, pb_utils' batch of requests reads as one made request by request, a Python model's usual answer
converts as the general path converts it (and anything unusual is left to that path), AlikeResults read
as those Responses, and the one-output columns of columns.output_columns are the general loop's."""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import numpy as np
import pytest
from inferd.worker import columns, tensors
from inferd.worker.backends import python_plain
from inferd.worker.backends.base import AlikeResults, PlainRequests, Request, Response, Tensor, requests_by_columns
from inferd.worker.compat import load_pb_utils

pb = load_pb_utils()


def slots(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in type(obj).__slots__}


def probe(request_id: int) -> bool:
    return request_id == 11


@pytest.mark.parametrize("ncolumns", [0, 1, 2])
def test_requests_by_columns_are_the_requests_init_makes(ncolumns):
    rows = [list(np.arange(6, dtype="<f4").reshape(3, 2) + c) for c in range(ncolumns)]
    cols = [("IN%d" % c, "FP32", rows[c]) for c in range(ncolumns)]
    wanted = ["OUT"]
    built = requests_by_columns([10, 11, 12], ["a", "", "c"], cols, wanted, probe)
    made = [Request(rid, cid, [Tensor(n, d, r[i]) for n, d, r in cols], wanted, cancelled=probe)
            for i, (rid, cid) in enumerate(zip([10, 11, 12], ["a", "", "c"]))]
    assert len(built) == 3
    for b, e in zip(built, made):
        got, want = slots(b), slots(e)
        assert [slots(t) for t in got.pop("inputs")] == [slots(t) for t in want.pop("inputs")]
        assert got == want
        assert b.requested_outputs is wanted  # shared, as the runtime shares it
    assert [r.is_cancelled() for r in built] == [False, True, False]


def pb_batch(requests: list[Request]) -> list[Any]:
    return pb.InferenceRequest._batch_from_worker(requests, ["OUT", "EXTRA"], "m", 3)


def test_batch_from_worker_reads_as_requests_made_one_by_one():
    x = np.arange(4, dtype="<f4")
    shared = ["OUT"]
    requests = [Request(1, "a", [Tensor("IN", "FP32", x)], shared),
                Request(2, "b", [Tensor("IN", "FP32", x), Tensor("K", "INT32", x.view("<i4"))], shared,
                        parameters='{"p":1}', correlation_id=5, flags=1, timeout_us=9),
                Request(3, "", [], [])]
    requests[1].trace = "t1"
    batch = pb_batch(requests)
    for r, q in zip(requests, batch):
        one = pb.InferenceRequest._from_worker(r.id, r.correlation_id, pb.Tensor._wrap_inputs(r.inputs),
                                               list(r.requested_outputs or ["OUT", "EXTRA"]), "m", 3, r.flags,
                                               r.timeout_us, r.parameters, r.is_cancelled, r.trace)
        for method in ("request_id", "correlation_id", "flags", "timeout", "parameters", "model_name",
                       "requested_output_names", "release_flags", "is_cancelled"):
            assert getattr(q, method)() == getattr(one, method)(), method
        assert [(t.name(), t.as_numpy().tolist()) for t in q.inputs()] == \
            [(t.name(), t.as_numpy().tolist()) for t in one.inputs()]
        assert q.trace().get_context() == one.trace().get_context()
        assert q._sender is None and q._stream is None and q._model_version == 3
    assert batch[1]._trace is not None and batch[0]._trace is None
    # requests that shared their list of wanted outputs share its copy; the accessor hands out copies
    assert batch[0]._requested is batch[1]._requested and batch[0]._requested is not shared
    names = batch[0].requested_output_names()
    names.append("changed")
    assert batch[1].requested_output_names() == ["OUT"] and batch[2].requested_output_names() == ["OUT", "EXTRA"]
    batch[0].set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert batch[0].release_flags() == pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
    assert batch[1].release_flags() == pb.TRITONSERVER_REQUEST_RELEASE_ALL


def general(pb_requests: list[Any], returned: list[Any]) -> list[Response]:
    """python_model's general conversion of answered requests (PythonBackend._convert)."""
    from inferd.worker.backends.python_model import PythonBackend

    return [PythonBackend._convert(None, req, resp) for req, resp in  # type: ignore[arg-type]
            zip(pb_requests, returned)]


def answered(n: int = 3) -> tuple[list[Any], list[Any]]:
    x = np.arange(4, dtype="<f4")
    pb_requests = pb_batch([Request(i, "", [Tensor("IN", "FP32", x)], ["OUT"] if i else []) for i in range(n)])
    returned = [pb.InferenceResponse(output_tensors=[pb.Tensor("OUT", x + i), pb.Tensor("EXTRA", x),
                                                     pb.Tensor("NOT_WANTED", x)]) for i in range(n)]
    return pb_requests, returned


def test_plain_results_are_the_general_conversion():
    pb_requests, returned = answered()
    plain = python_plain.plain_results(pb_requests, returned, pb.InferenceResponse)
    assert plain is not None
    want = general(pb_requests, returned)
    for got, exp in zip(plain, want):
        g, e = slots(got), slots(exp)
        assert [slots(t) for t in g.pop("outputs")] == [slots(t) for t in e.pop("outputs")]
        assert g == e
    assert [[t.name for t in r.outputs] for r in plain] == [["OUT", "EXTRA"], ["OUT"], ["OUT"]]


class Sub(pb.InferenceResponse):  # type: ignore[misc,name-defined]
    pass


@pytest.mark.parametrize("unusual", ["error", "parameters", "none", "subclass", "sender", "rescheduled",
                                     "short", "tuple"])
def test_anything_unusual_is_left_to_the_general_path(unusual):
    pb_requests, returned = answered()
    if unusual == "error":
        returned[1] = pb.InferenceResponse(error=pb.TritonError("no"))
    elif unusual == "parameters":
        returned[1] = pb.InferenceResponse(output_tensors=[], parameters={"k": 1})
    elif unusual == "none":
        returned[1] = None
    elif unusual == "subclass":
        returned[1] = Sub(output_tensors=[])
    elif unusual == "sender":
        pb_requests[1].get_response_sender()
    elif unusual == "rescheduled":
        pb_requests[1].set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    elif unusual == "short":
        returned.pop()
    else:
        returned = tuple(returned)  # type: ignore[assignment]
    assert python_plain.plain_results(pb_requests, returned, pb.InferenceResponse) is None


SPECS = tensors.output_specs({"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]})


def one_output(arrays: list[Any], names: Any = None, wanted: Any = None) -> tuple[list[Request], list[Response]]:
    names = names or ["Y"] * len(arrays)
    requests = [Request(i, "", [], wanted if wanted is not None else []) for i in range(len(arrays))]
    return requests, [Response([Tensor(n, "FP32", a)]) for n, a in zip(names, arrays)]


def both_ways(requests: list[Request], results: list[Response]) -> tuple[Any, Any]:
    short = columns.output_columns(requests, results, SPECS, ["Y"], "m", tensors.output_as_returned)
    with mock.patch.object(columns, "_one_output_alike", lambda *a: None):
        long = columns.output_columns(requests, results, SPECS, ["Y"], "m", tensors.output_as_returned)
    return short, long


def frames(found: Any) -> Any:
    return None if found is None else (found[0], [bytes(f) for f in found[1]])


base = np.arange(16, dtype="<f4").reshape(4, 4)
CASES = {
    "alike": [base[0], base[1], base[2]],
    "later strided": [base[0], base[:, 1], base[:, 2]],  # not C-contiguous: copied by the general loop
    "first strided": [base[:, 0], base[0], base[1]],
    "other shape": [base[0], base[1, :2], base[2]],
    "other dtype": [base[0], base[1].astype("<f8"), base[2]],
    "big endian": [base[0].astype(">f4"), base[1].astype(">f4"), base[2].astype(">f4")],
    "not arrays": [base[0], [1.0, 2.0, 3.0, 4.0], base[2]],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_output_columns_are_the_general_loops(case):
    short, long = both_ways(*one_output(CASES[case]))
    assert frames(short) == frames(long)
    if case in ("alike", "later strided", "big endian"):
        assert short is not None


@pytest.mark.parametrize("case", ["other name", "unwanted", "some unwanted", "two outputs", "error", "params"])
def test_one_output_columns_hold_to_names_wanted_and_errors(case):
    arrays = CASES["alike"]
    if case == "other name":
        requests, results = one_output(arrays, names=["Y", "Z", "Y"])
    elif case == "unwanted":
        requests, results = one_output(arrays, wanted=["S"])
    elif case == "some unwanted":
        requests, results = one_output(arrays)
        requests[2].requested_outputs = ["S"]
    elif case == "two outputs":
        requests, results = one_output(arrays)
        results[1].outputs.append(Tensor("S", "FP32", arrays[0]))
    elif case == "error":
        requests, results = one_output(arrays)
        results[1].error = tensors.internal("no")
    else:
        requests, results = one_output(arrays)
        results[1].parameters = {"k": 1}
    short, long = both_ways(requests, results)
    assert frames(short) == frames(long)


def test_the_columns_of_a_python_model_batch_are_its_rows_in_order():
    rows = list(np.arange(32 * 4, dtype="<f4").reshape(32, 4))
    requests = requests_by_columns(list(range(32)), itertools.repeat(""), [("IN", "FP32", rows)], [], None)
    pb_requests = pb_batch(requests)
    returned = [pb.InferenceResponse(output_tensors=[pb.Tensor("OUT", pb.get_input_tensor_by_name(r, "IN")
                                                               .as_numpy())]) for r in pb_requests]
    results = python_plain.alike_results(pb_requests, returned, pb.InferenceResponse)
    assert type(results) is AlikeResults
    specs = tensors.output_specs({"output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]})
    found = columns.output_columns(requests, results, specs, ["OUT", "EXTRA"], "m", tensors.output_as_returned)
    assert found is not None
    assert found[0] == [("OUT", "FP32", (4,))] and bytes(found[1][0]) == np.stack(rows).tobytes()


def answered_alike(arrays: list[Any], names: Any = None, wanted: Any = None) -> tuple[list[Any], list[Any]]:
    names = names or ["OUT"] * len(arrays)
    pb_requests = pb_batch([Request(i, "", [], wanted if wanted is not None else []) for i in range(len(arrays))])
    return pb_requests, [pb.InferenceResponse(output_tensors=[pb.Tensor(n, a)]) for n, a in zip(names, arrays)]


def test_alike_results_read_as_the_general_conversion():
    pb_requests, returned = answered_alike(CASES["alike"])
    alike = python_plain.alike_results(pb_requests, returned, pb.InferenceResponse)
    assert type(alike) is AlikeResults and len(alike) == 3 and alike.arrays[1] is CASES["alike"][1]
    want = general(pb_requests, returned)
    as_read = [list(alike), [alike[i] for i in range(3)], alike[:]]
    assert as_read[0] is not want and as_read[0][0] is as_read[1][0]  # built once
    for got in as_read:
        assert [[slots(t) for t in r.outputs] for r in got] == [[slots(t) for t in r.outputs] for r in want]
        assert [(r.error, r.parameters) for r in got] == [(r.error, r.parameters) for r in want]


@pytest.mark.parametrize("case", ["two outputs", "other name", "unwanted", "other shape", "other dtype",
                                  "not arrays", "error", "none", "sender", "empty"])
def test_alike_results_only_for_one_wanted_output_alike(case):
    arrays = list(CASES["alike"])
    names = wanted = None
    if case == "other name":
        names = ["OUT", "OUT", "EXTRA"]
    elif case == "unwanted":
        wanted = ["EXTRA"]
    elif case in ("other shape", "other dtype"):
        arrays = CASES[case]
    elif case == "not arrays":  # a numpy scalar is no ndarray: refused by pb_utils, as by python_backend
        with pytest.raises(TypeError, match="incompatible constructor arguments"):
            pb.Tensor("OUT", np.float32(1.5))
        return
    elif case == "empty":
        arrays = []
    pb_requests, returned = answered_alike(arrays, names, wanted)
    if case == "two outputs":
        returned[1] = pb.InferenceResponse(output_tensors=[pb.Tensor("OUT", arrays[1]), pb.Tensor("EXTRA", arrays[1])])
    elif case == "error":
        returned[1] = pb.InferenceResponse(output_tensors=[pb.Tensor("OUT", arrays[1])], error=pb.TritonError("no"))
    elif case == "none":
        returned[1] = None
    elif case == "sender":
        pb_requests[1].get_response_sender()
    assert python_plain.alike_results(pb_requests, returned, pb.InferenceResponse) is None


def alike_both_ways(arrays: list[Any], wanted: Any = None) -> tuple[Any, Any]:
    requests = [Request(i, "", [], wanted if wanted is not None else []) for i in range(len(arrays))]
    results = AlikeResults("Y", "FP32", list(arrays))
    short = columns.output_columns(requests, results, SPECS, ["Y"], "m", tensors.output_as_returned)
    long = columns.output_columns(requests, list(results), SPECS, ["Y"], "m", tensors.output_as_returned)
    return short, long


@pytest.mark.parametrize("case", ["alike", "later strided", "first strided", "big endian"])
def test_alike_results_go_by_columns_as_the_general_loop_sends_them(case):
    short, long = alike_both_ways(CASES[case])
    assert frames(short) == frames(long) and short is not None


def test_alike_results_keep_the_wanted_outputs_rule():
    short, long = alike_both_ways(CASES["alike"], wanted=["S"])
    assert frames(short) == frames(long) == ([], [])  # no request wanted it: no column (the general rule)
    requests = [Request(i, "", [], ["Y"] if i != 1 else ["S"]) for i in range(3)]
    assert columns.output_columns(requests, AlikeResults("Y", "FP32", list(CASES["alike"])), SPECS, ["Y"], "m",
                                  tensors.output_as_returned) is None


def test_batch_requests_ask_their_worker_request_whether_cancelled():
    cancelled = {11}
    requests = [Request(rid, "", [], [], cancelled=cancelled.__contains__) for rid in (10, 11)]
    batch = pb_batch(requests + [Request(12, "", [], [])])
    assert [q.is_cancelled() for q in batch] == [False, True, False]
    cancelled.add(10)
    assert batch[0].is_cancelled() is True


def test_a_plain_batch_reads_as_any_other():
    """requests_by_columns' requests come as PlainRequests: pb_utils then leaves their default fields to
    the class, and they read the same."""
    rows = list(np.arange(8, dtype="<f4").reshape(2, 4))
    requests = requests_by_columns([1, 2], ["a", ""], [("IN", "FP32", rows)], ["OUT"], None)
    assert type(requests) is PlainRequests and isinstance(requests, list)
    plain = pb.InferenceRequest._batch_from_worker(requests, ["OUT"], "m", 3, True)
    other = pb.InferenceRequest._batch_from_worker(list(requests), ["OUT"], "m", 3, False)
    for p, o in zip(plain, other):
        for method in ("request_id", "correlation_id", "flags", "timeout", "parameters", "model_name",
                       "requested_output_names", "release_flags", "is_cancelled"):
            assert getattr(p, method)() == getattr(o, method)(), method
        assert p.trace().get_context() == o.trace().get_context() is None
    plain[0].set_flags(3)
    assert plain[0].flags() == 3 and plain[1].flags() == 0
