"""--log-format json: every line of the server log, the workers' and the model's pb_utils.Logger lines
included, is one JSON object, with the model (and instance) where a line is about one."""

from __future__ import annotations

import json


def test_every_log_line_is_a_json_object(server_factory):
    server = server_factory(["add_sub"], extra_args=["--log-format", "json"])
    assert server.http_client().get_log_settings()["log_format"] == "json"
    assert server.stop() == 0
    lines = [line for line in server.log().splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]  # a line that is not JSON fails here
    assert all({"time", "severity", "pid", "source", "message"} <= set(d) for d in docs)
    assert any(d["message"].startswith("successfully loaded 'add_sub'") and d["model"] == "add_sub" for d in docs)
    # the worker's own lines (add_sub logs through pb_utils.Logger as it finalizes)
    worker = [d for d in docs if d.get("instance", "").startswith("add_sub_")]
    assert worker and all(d["model"] == "add_sub" and d["version"] == "1" and d["pid"] != server.pid
                          for d in worker)
