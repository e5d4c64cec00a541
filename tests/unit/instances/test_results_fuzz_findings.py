"""What fuzz/targets/wire_codec.py found in the supervisor's reading of worker messages (instances/results.py)."""

from __future__ import annotations

from inferd.supervisor.instances import results
from inferd.worker.wire import messages as m


def test_a_worker_log_line_with_a_lone_surrogate_is_read_not_a_protocol_error():
    """orjson refuses the escaped lone surrogate json writes (a model logging text decoded with
    surrogateescape); the worker was killed for "a malformed message"."""
    for message in (m.Log("INFO", "file b'\\xff' is \udcff"),
                    m.Bye(m.WireError(1, "bad \udcff")),
                    m.ExecuteResult(1, [m.ResponseItem(1, [], m.WireError(3, "bad input \udcff"))])):
        raw = m.encode_header(message)
        assert results.read([raw])[0] == message
        assert results.decode([memoryview(raw)])[0] == message
