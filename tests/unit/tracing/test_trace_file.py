"""The trace file writer: with log_frequency 0 one JSON array in <file>, written out in parts as traces
pile up (memory stays bounded) and completed at close; with N, complete arrays in <file>.0, .1, ..."""

from __future__ import annotations

import json

from inferd.supervisor.tracing import trace_file
from inferd.supervisor.tracing.record import Trace


def _trace(n: int) -> Trace:
    t = Trace(n, "m", "1", "r%d" % n, None, False, lambda t: None)
    for i, name in enumerate(("REQUEST_START", "QUEUE_START", "REQUEST_END")):
        t.stamp(name, 1000 * n + i)
    return t


def test_one_array_written_in_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_file, "_BUFFERED", 2)
    writer = trace_file.TraceFileWriter(str(tmp_path / "t.json"), 0)
    for n in range(1, 6):
        writer.add(_trace(n))
    writer.close()
    records = json.loads((tmp_path / "t.json").read_text())
    assert [r["request_id"] for r in records if "model_name" in r] == ["r1", "r2", "r3", "r4", "r5"]
    assert not list(tmp_path.glob("t.json.*"))


def test_rotation_and_a_frequency_change_flushes(tmp_path):
    writer = trace_file.TraceFileWriter(str(tmp_path / "t.json"), 2)
    for n in range(1, 4):
        writer.add(_trace(n))
    writer.set_frequency(0)  # the third trace, collected under frequency 2, goes to t.json.1
    writer.add(_trace(4))
    writer.close()
    heads = {p.name: [r["id"] for r in json.loads(p.read_text()) if "model_name" in r]
             for p in sorted(tmp_path.iterdir())}
    assert heads == {"t.json": [4], "t.json.0": [1, 2], "t.json.1": [3]}


def test_an_unwritable_file_is_logged_not_raised(tmp_path, caplog):
    writer = trace_file.TraceFileWriter(str(tmp_path / "missing" / "t.json"), 1)
    writer.add(_trace(1))
    writer.close()
    assert "cannot write trace file" in caplog.text


class _Result:
    def __init__(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.compute_input_ns, self.compute_infer_ns, self.compute_output_ns = input_ns, infer_ns, output_ns


def test_compute_stamps_stay_in_order_whatever_the_worker_measured():
    # the worker's durations are placed before the batch's end; where they exceed the time the supervisor saw
    # (its start is taken just before the send), the stamps still never run backwards
    cases = ((_Result(10, 20, 5), 100, 200), (_Result(60, 60, 60), 100, 150), (_Result(0, 0, 0), 5, 5))
    for result, start, end in cases:
        t = _trace(1)
        t.computed(start, end, result, "m_0")
        stamps = [ns for name, ns in t.stamps if name.startswith("COMPUTE")]
        assert stamps == sorted(stamps) and stamps[0] >= start and stamps[-1] == end
    t = _trace(2)
    t.computed(100, 200, _Result(10, 20, 5), "m_0")
    assert dict(t.stamps)["COMPUTE_START"] == 165 and dict(t.stamps)["COMPUTE_OUTPUT_START"] == 195


def test_tensor_text_bounds_what_is_held(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_file, "_BUFFERED_BYTES", 100)
    writer = trace_file.TraceFileWriter(str(tmp_path / "t.json"), 0)
    big = _trace(1)
    big.tensor("TENSOR_QUEUE_INPUT", "X", "INT8", [200], bytes(200))
    writer.add(big)
    writer._pool.shutdown(wait=True)  # the write it queued is done
    assert (tmp_path / "t.json").read_text().startswith("[")  # written before close: not held in memory
