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
