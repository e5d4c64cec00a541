"""core.warmup: building model_warmup samples from a config (shapes, data, files, bounds, checks)
and running them on a worker (errors, decoupled streams, statistics)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from inferd.supervisor.core import warmup
from inferd.supervisor.inference.types import InferResponse
from inferd.supervisor.instances.results import BatchResult
from inferd.supervisor.metrics.model_statistics import ModelStats
from inferd.worker.wire.errors import ErrorCode, InferdError


def config(samples: list[dict], max_batch_size: int = 4, inputs: list[dict] | None = None, **extra: Any) -> dict:
    return {
        "name": "m", "backend": "python", "max_batch_size": max_batch_size,
        "input": inputs if inputs is not None else [
            {"name": "F", "data_type": "TYPE_FP32", "dims": [3]},
            {"name": "S", "data_type": "TYPE_STRING", "dims": [2]},
        ],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "model_warmup": samples,
        **extra,
    }


def sample(name: str = "s", batch_size: int = 1, count: int = 0, **inputs: dict) -> dict:
    return {"name": name, "batch_size": batch_size, "count": count, "inputs": inputs}


def f32(kind: str = "zero_data", value: Any = True, dims: list[int] | None = None) -> dict:
    return {"data_type": "TYPE_FP32", "dims": [3] if dims is None else dims, kind: value}


def strings(kind: str = "zero_data", value: Any = True) -> dict:
    return {"data_type": "TYPE_STRING", "dims": [2], kind: value}


def bytes_wire(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "f.bin").write_bytes(np.array([1.5, 2.5, 3.5, 9.0], "<f4").tobytes())
    (tmp_path / "warmup" / "short.bin").write_bytes(b"abcd")
    (tmp_path / "warmup" / "s.bin").write_bytes(bytes_wire(b"hello", b"warm"))
    (tmp_path / "warmup" / "bad_s.bin").write_bytes(bytes_wire(b"only one"))
    (tmp_path / "config.pbtxt").write_text("name: 'm'")
    return tmp_path


def build(cfg: dict, model_dir: Path) -> list[warmup.WarmupSample]:
    return warmup.build_samples(cfg, str(model_dir))


def error_of(cfg: dict, model_dir: Path) -> str:
    with pytest.raises(InferdError) as info:
        build(cfg, model_dir)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


# ---------------------------------------------------------------------------- building


def test_no_samples(model_dir):
    assert build(config([]), model_dir) == []
    assert build({"name": "m", "input": []}, model_dir) == []


def test_zero_data_with_batch_dimension(model_dir):
    [s] = build(config([sample(batch_size=2, count=3, F=f32(), S=strings())]), model_dir)
    assert (s.name, s.batch_size, s.count) == ("s", 2, 3)
    reqs = s.requests("m", "1", decoupled=False)
    assert len(reqs) == 2
    for r in reqs:
        assert (r.model_name, r.model_version, r.id) == ("m", "1", "")
        f, st = r.inputs
        assert (f.name, f.datatype, f.shape, f.data) == ("F", "FP32", [1, 3], bytes(12))
        assert (st.name, st.datatype, st.shape, st.data) == ("S", "BYTES", [1, 2], bytes(8))  # two empty elements
        assert r.response_sink is None


def test_no_batch_dimension_without_batching(model_dir):
    [s] = build(config([sample(F=f32(), S=strings())], max_batch_size=0), model_dir)
    assert [t.shape for t in s.requests("m", "1", False)[0].inputs] == [[3], [2]]


def test_batch_size_zero_is_skipped_and_count_zero_runs_once(model_dir):
    samples = build(config([sample("skip", batch_size=0, F=f32(), S=strings()),
                            sample("once", F=f32(), S=strings())]), model_dir)
    assert [(s.name, s.count) for s in samples] == [("once", 1)]


def test_random_data(model_dir):
    inputs = [{"name": "F", "data_type": "TYPE_FP32", "dims": [3]},
              {"name": "S", "data_type": "TYPE_STRING", "dims": [2]},
              {"name": "B", "data_type": "TYPE_BOOL", "dims": [4096]}]
    [s] = build(config([sample(F=f32("random_data"), S=strings("random_data"),
                               B={"data_type": "TYPE_BOOL", "dims": [4096], "random_data": True})],
                       inputs=inputs), model_dir)
    f, st, b = s.requests("m", "1", False)[0].inputs
    assert len(f.data) == 12
    assert st.data == bytes(8)  # BYTES random_data: empty elements, as Triton
    assert len(b.data) == 4096 and set(b.data) <= {0, 1} and len(set(b.data)) == 2
    assert s.requests("m", "1", False)[0].inputs[0].data != f.data  # fresh random data every run


def test_input_data_files(model_dir):
    [s] = build(config([sample(F=f32("input_data_file", "f.bin"), S=strings("input_data_file", "s.bin"))]),
                model_dir)
    f, st = s.requests("m", "1", False)[0].inputs
    assert np.frombuffer(f.data, "<f4").tolist() == [1.5, 2.5, 3.5]  # the first 12 of 16 bytes
    assert st.data == bytes_wire(b"hello", b"warm")  # BYTES: the whole file


def test_short_file(model_dir):
    msg = error_of(config([sample(F=f32("input_data_file", "short.bin"), S=strings())]), model_dir)
    assert msg == ("invalid warmup sample 's': warmup setting expects 12 bytes for input 'F', but the data "
                   "provided from short.bin only has 4 bytes")


def test_missing_file(model_dir):
    msg = error_of(config([sample(F=f32("input_data_file", "nope.bin"), S=strings())]), model_dir)
    assert "invalid warmup sample 's': failed to read input_data_file" in msg
    assert "warmup/nope.bin: No such file or directory" in msg


@pytest.mark.parametrize("path", ["../config.pbtxt", "/etc/passwd", "", ".", "a/../../config.pbtxt", 7])
def test_file_must_be_inside_the_warmup_directory(model_dir, path):
    msg = error_of(config([sample(F=f32("input_data_file", path), S=strings())]), model_dir)
    assert "must name a file inside the model's 'warmup' directory" in msg


def test_file_must_be_regular(model_dir):
    (model_dir / "warmup" / "dir").mkdir()
    msg = error_of(config([sample(F=f32("input_data_file", "dir"), S=strings())]), model_dir)
    assert "is not a regular file" in msg


def test_bytes_file_framing_is_checked(model_dir):
    msg = error_of(config([sample(F=f32(), S=strings("input_data_file", "bad_s.bin"))]), model_dir)
    assert msg == "invalid warmup sample 's': [request id: <id_unknown>] expected 2 elements in BYTES tensor 'S', got 1"


def test_variable_dims_and_missing_data_kind(model_dir):
    msg = error_of(config([sample(F=f32(dims=[-1]), S=strings())]), model_dir)
    assert msg == ("invalid warmup sample 's': warmup setting expects all variable-size dimensions are "
                   "specified for input 'F'")
    msg = error_of(config([sample(F={"data_type": "TYPE_FP32", "dims": [3]}, S=strings())]), model_dir)
    assert msg == "invalid warmup sample 's': warmup setting expects input 'F' to have input_data_type set"


def test_explicit_false_still_selects_the_kind(model_dir):
    [s] = build(config([sample(F=f32("zero_data", False), S=strings())]), model_dir)
    assert s.inputs[0].kind == "zero_data"


@pytest.mark.parametrize("dims", [[1 << 40, 1 << 20], [1 << 62, 1 << 62, 1 << 62], [1 << 27, 2]])
def test_absurd_sizes_are_refused_before_allocation(model_dir, dims):
    msg = error_of(config([sample(F=f32(dims=dims), S=strings())], inputs=[
        {"name": "F", "data_type": "TYPE_FP32", "dims": [-1] * len(dims)},
        {"name": "S", "data_type": "TYPE_STRING", "dims": [2]}]), model_dir)
    assert "beyond the %d bytes a warmup sample may hold" % warmup.MAX_SAMPLE_BYTES in msg


def test_the_bound_covers_all_inputs_and_the_batch(model_dir):
    elements = warmup.MAX_SAMPLE_BYTES * 2 // 5 // 4  # FP32: 40 % of the bound per input
    inputs = [{"name": n, "data_type": "TYPE_FP32", "dims": [-1]} for n in "ABC"]
    three = sample(A=f32(dims=[elements]), B=f32(dims=[elements]), C=f32(dims=[elements]))
    msg = error_of(config([three], inputs=inputs), model_dir)
    assert "input 'C'" in msg and "takes the sample beyond the" in msg
    three["batch_size"] = 2
    msg = error_of(config([three], inputs=inputs), model_dir)
    assert "input 'B'" in msg and "2 requests" in msg


def test_batch_size_beyond_max_batch_size(model_dir):
    msg = error_of(config([sample(batch_size=5, F=f32(), S=strings())]), model_dir)
    assert msg == "failed to run warmup sample 's': batch size 5 for 'm', max allowed is 4"
    msg = error_of(config([sample(batch_size=2, F=f32(), S=strings())], max_batch_size=0), model_dir)
    assert msg == "failed to run warmup sample 's': batch size 2 for 'm', max allowed is 0"


@pytest.mark.parametrize("field,value", [("count", -1), ("count", 1 << 21), ("count", "2"), ("batch_size", -1)])
def test_counts_are_bounded(model_dir, field, value):
    s = sample(F=f32(), S=strings())
    s[field] = value
    assert "%s must be an integer" % field in error_of(config([s]), model_dir)


def test_request_checks_name_the_sample(model_dir):
    msg = error_of(config([sample("dt", F={"data_type": "TYPE_INT32", "dims": [3], "zero_data": True},
                                  S=strings())]), model_dir)
    assert msg == ("invalid warmup sample 'dt': [request id: <id_unknown>] inference input 'F' data-type is "
                   "'INT32', but model 'm' expects 'FP32'")
    msg = error_of(config([sample("shape", F=f32(dims=[5]), S=strings())]), model_dir)
    assert "unexpected shape for input 'F' for model 'm'. Expected [-1,3], got [1,5]" in msg
    msg = error_of(config([sample("missing", F=f32())]), model_dir)
    assert "expected 2 inputs but got 1 inputs for model 'm'" in msg


def test_undeclared_inputs_pass_through_after_the_declared_ones(model_dir):
    extra = {"data_type": "TYPE_INT32", "dims": [2], "zero_data": True}
    [s] = build(config([sample(Z=extra, S=strings(), A=extra, F=f32())]), model_dir)
    assert [(i.name, i.shape) for i in s.inputs] == [("F", (1, 3)), ("S", (1, 2)), ("A", (1, 2)), ("Z", (1, 2))]


def test_sequence_control_inputs_are_passed_as_given(model_dir):
    seq = {"control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START",
                                                             "int32_false_true": [0, 1]}]}]}
    start = {"data_type": "TYPE_INT32", "dims": [1], "zero_data": True}
    [s] = build(config([sample(F=f32(), S=strings(), START=start)], sequence_batching=seq), model_dir)
    assert [i.name for i in s.inputs] == ["F", "S", "START"]


@pytest.mark.parametrize("bad", [["not a dict"], [{"name": "s", "batch_size": 1, "inputs": []}],
                                 [sample(F="zero")], [sample(F={"data_type": "TYPE_NOPE", "dims": [3],
                                                                "zero_data": True})],
                                 [sample(F={"data_type": "TYPE_FP32", "dims": [1.5], "zero_data": True})]])
def test_malformed_entries(model_dir, bad):
    error_of(config(bad), model_dir)


# ---------------------------------------------------------------------------- running


class FakeWorker:
    """execute() answers with `answer(requests)`; decoupled requests get `stream(request)` items."""

    name = "m_0"

    def __init__(self, answer=None, stream=None, raises: InferdError | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.answer = answer or (lambda reqs: [InferResponse("m", "1") for _ in reqs])
        self.stream = stream
        self.raises = raises

    async def execute(self, requests):
        self.batches.append(list(requests))
        if self.raises is not None:
            raise self.raises
        if self.stream is not None:
            for r in requests:
                for item, final in self.stream(r):
                    r.response_sink.put(item, final)
        return BatchResult(self.answer(requests), 10, 20, 30)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def warmer(model_dir, samples, stats=None, decoupled=False, **cfg):
    built = build(config(samples, **cfg), model_dir)
    return warmup.Warmer("m", "1", built, stats if stats is not None else ModelStats("m", "1"), decoupled)


def test_runs_every_sample_count_times_and_counts_them(model_dir):
    stats = ModelStats("m", "1")
    w = warmer(model_dir, [sample("a", batch_size=2, count=2, F=f32(), S=strings()),
                           sample("b", F=f32(), S=strings())], stats)
    worker = FakeWorker()
    run(w(worker))
    assert [len(b) for b in worker.batches] == [2, 2, 1]
    assert len({id(r) for b in worker.batches for r in b}) == 5  # fresh requests every run
    assert (stats.execution_count, stats.inference_count, stats.success_count) == (3, 5, 5)
    assert sorted(stats.batch_stats) == [1, 2] and stats.batch_stats[2][:2] == [2, 20]
    assert stats.compute_infer_ns == 5 * 20 and stats.last_inference > 0


def test_error_responses_fail_naming_the_sample(model_dir):
    stats = ModelStats("m", "1")
    w = warmer(model_dir, [sample("ok", F=f32(), S=strings()), sample("bad", batch_size=3, F=f32(), S=strings())],
               stats)

    def answer(reqs):
        if len(reqs) == 1:
            return [InferResponse("m", "1")]
        boom = InferdError(ErrorCode.INTERNAL, "boom")
        return [boom, InferResponse("m", "1"), boom]  # the same message once

    with pytest.raises(InferdError) as info:
        run(w(FakeWorker(answer)))
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == "failed to run warmup sample 'bad': boom"
    assert stats.execution_count == 1  # only the sample that succeeded


def test_worker_failure_fails_the_sample(model_dir):
    w = warmer(model_dir, [sample("x", count=5, F=f32(), S=strings())])
    worker = FakeWorker(raises=InferdError(ErrorCode.UNAVAILABLE, "model 'm' instance 'm_0' died: SIGKILL"))
    with pytest.raises(InferdError) as info:
        run(w(worker))
    assert info.value.message == "failed to run warmup sample 'x': model 'm' instance 'm_0' died: SIGKILL"
    assert len(worker.batches) == 1


def test_decoupled_streams_are_drained(model_dir):
    def stream(_req):
        return [(InferResponse("m", "1"), False), (InferResponse("m", "1"), False), (InferResponse("m", "1"), True)]

    stats = ModelStats("m", "1")
    w = warmer(model_dir, [sample("d", batch_size=2, F=f32(), S=strings())], stats, decoupled=True)
    worker = FakeWorker(stream=stream)
    run(w(worker))
    assert all(r.response_sink is not None and r.response_sink.ended for r in worker.batches[0])
    assert stats.inference_count == 2

    def failing(_req):
        return [(InferResponse("m", "1"), False), (InferdError(ErrorCode.INTERNAL, "late error"), True)]

    with pytest.raises(InferdError) as info:
        run(w(FakeWorker(stream=failing)))
    assert info.value.message == "failed to run warmup sample 'd': late error"


def test_build_warmer(model_dir):
    stats = ModelStats("m", "1")
    assert run(warmup.build_warmer(config([]), str(model_dir), "m", "1", stats)) is None
    assert run(warmup.build_warmer(config([sample(batch_size=0)]), str(model_dir), "m", "1", stats)) is None
    w = run(warmup.build_warmer(config([sample(F=f32(), S=strings())],
                                       model_transaction_policy={"decoupled": True}), str(model_dir), "m", "1", stats))
    assert w is not None and w.decoupled and [s.name for s in w.samples] == ["s"]
