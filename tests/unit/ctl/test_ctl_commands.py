"""infer-ctl against a tiny real HTTP server serving canned Triton/inferd JSON."""

from __future__ import annotations

import base64
import io
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from inferd.supervisor.ctl import main as ctl
from inferd.supervisor.ctl.render import table

from .fake_server import CONFIG, INDEX, METADATA, STATS, STATUS, FakeServer, triton_like


@pytest.fixture()
def server() -> Iterator[FakeServer]:
    with triton_like() as s:
        yield s


def run(server: FakeServer, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = ctl.main(["--url", server.url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


# ---- index ----
def test_index_table(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(server, capsys, "index")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "STATE", "REASON"]
    assert lines[1].split() == ["ident", "1", "READY", "-"]
    assert lines[2].split()[:3] == ["broken", "1", "UNAVAILABLE"] and "failed to load: boom" in lines[2]
    assert lines[3].split() == ["ondisk", "-", "-", "-"]
    # aligned: every column starts at the same offset on every line
    assert len({line.index(" ", len("broken")) for line in lines[1:3]}) == 1
    assert {line.find("1") for line in lines[1:3]} == {lines[0].index("VERSION") + len("VERSION") - 1}
    assert server.requests == [("POST", "/v2/repository/index", None)]


def test_list_alias_ready_filter_and_json(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "list", "--ready", "--json")
    assert code == 0
    assert json.loads(out) == INDEX
    assert server.requests == [("POST", "/v2/repository/index", {"ready": True})]


def test_json_flag_before_the_command(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = ctl.main(["--json", "--url", server.url, "stats"])
    assert code == 0
    assert json.loads(capsys.readouterr().out) == STATS


def test_url_from_environment(server: FakeServer, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERD_URL", server.url)
    assert ctl.main(["index", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == INDEX


# ---- load / unload ----
def test_load_plain(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(server, capsys, "load", "ident")
    assert code == 0, err
    assert out.startswith("loaded ident in ")
    assert ["ident", "1", "READY", "-"] in rows(out)
    assert server.requests[0] == ("POST", "/v2/repository/models/ident/load", None)


def test_load_with_config_text_file_and_files(server: FakeServer, capsys: pytest.CaptureFixture[str],
                                              tmp_path) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"backend": "python", "max_batch_size": 4}')
    model = tmp_path / "model.py"
    model.write_bytes(b"print('hi')\n")
    code, out, err = run(server, capsys, "load", "ident", "--config", "@" + str(cfg),
                         "--file", "1/model.py=" + str(model), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["name"] == "ident" and doc["loaded"] is True and doc["versions"] == [INDEX[0]]
    method, path, body = server.requests[0]
    assert (method, path) == ("POST", "/v2/repository/models/ident/load")
    assert body == {"parameters": {
        "config": '{"backend": "python", "max_batch_size": 4}',
        "file:1/model.py": base64.b64encode(b"print('hi')\n").decode(),
    }}
    server.requests.clear()
    assert run(server, capsys, "load", "ident", "--config", '{"max_batch_size": 0}')[0] == 0
    assert server.requests[0][2] == {"parameters": {"config": '{"max_batch_size": 0}'}}


@pytest.mark.parametrize("argv, message", [
    (["--config", "{nope"], "--config is not valid JSON"),
    (["--config", "[1]"], "must be a JSON object"),
    (["--config", "@/does/not/exist.json"], "cannot read config file"),
    (["--file", "1/model.py=/etc/hostname"], "--file needs --config"),
    (["--config", "{}", "--file", "nothing"], "--file expects VERSION/PATH=LOCAL_FILE"),
])
def test_load_bad_arguments_fail_before_asking(server: FakeServer, capsys: pytest.CaptureFixture[str],
                                               argv: list[str], message: str) -> None:
    code, out, err = run(server, capsys, "load", "ident", *argv)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and message in err
    assert server.requests == []


def test_load_failure_shows_the_server_message(server: FakeServer,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(server, capsys, "load", "nope")
    assert code == 1 and out == ""
    assert err == "error: failed to load 'nope', failed to poll from model repository\n"
    code, out, err = run(server, capsys, "load", "nope", "--json")
    assert code == 1
    assert json.loads(out) == {"error": "failed to load 'nope', failed to poll from model repository"}


def test_unload_with_dependents(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "unload", "ident", "--unload-dependents")
    assert code == 0 and out.startswith("unloaded ident in ")
    assert server.requests == [("POST", "/v2/repository/models/ident/unload",
                                {"parameters": {"unload_dependents": True}})]
    server.requests.clear()
    code, out, _ = run(server, capsys, "unload", "ident", "--json")
    assert json.loads(out)["unloaded"] is True
    assert server.requests == [("POST", "/v2/repository/models/ident/unload", None)]


def test_progress_spinner_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    gate = threading.Event()
    result, elapsed = ctl._wait_with_progress("loading x", lambda: gate.wait(0.35) or 42, stream)
    assert result == 42 and elapsed >= 0.3
    text = stream.getvalue()
    assert text.count("loading x") >= 2 and "s " in text
    assert text.endswith("\r\033[K")

    plain = io.StringIO()
    assert ctl._wait_with_progress("loading x", lambda: 7, plain)[0] == 7
    assert plain.getvalue() == ""  # not a TTY: nothing on stderr

    def boom() -> None:
        raise ctl.CtlError("nope")

    with pytest.raises(ctl.CtlError):
        ctl._wait_with_progress("loading x", boom, Tty())


def test_load_waits_past_the_default_timeout_only_when_asked(server: FakeServer,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    server.delay_s = 1.0
    code, _, err = run(server, capsys, "load", "ident", "--timeout", "0.2")
    assert code == 1 and "timed out" in err
    server.delay_s = 0.3
    code, _, err = run(server, capsys, "load", "ident")  # no limit by default
    assert code == 0, err


# ---- status ----
def test_status_from_the_inferd_endpoint(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.on("GET", "/v2/inferd/status", body=STATUS)
    server.on("GET", "/v2/inferd/status/models/ident", body={"models": STATUS["models"][:1]})
    code, out, err = run(server, capsys, "status")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "ident (version 1): READY"
    assert lines[1].split() == ["INSTANCE", "PID", "STATE", "RESTARTS", "INFLIGHT", "LAST", "ERROR"]
    assert lines[2].split() == ["ident_0", "4101", "ready", "0", "2", "-"]
    assert lines[3].split()[:5] == ["ident_1", "4188", "ready", "3", "0"]
    assert lines[3].endswith("worker exited with signal 9 (SIGKILL)")
    assert lines[4] == "broken (version 1): UNAVAILABLE - failed to load: boom"
    assert lines[5] == "  (no instances)"
    code, out, _ = run(server, capsys, "status", "ident", "--json")
    assert json.loads(out) == {"models": STATUS["models"][:1]}
    assert server.requests[-1][:2] == ("GET", "/v2/inferd/status/models/ident")


def test_status_falls_back_to_the_index(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(server, capsys, "status")
    assert code == 0
    assert "repository index only" in err
    assert out.splitlines()[0] == "ident (version 1): READY"
    code, out, err = run(server, capsys, "status", "broken", "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["source"] == "index"
    assert doc["models"] == [{"name": "broken", "version": "1", "state": "UNAVAILABLE",
                              "reason": "failed to load: boom", "instances": None}]
    code, out, err = run(server, capsys, "status", "zzz")
    assert code == 1 and "unknown model: 'zzz'" in err


def test_status_model_error_is_not_mistaken_for_a_missing_endpoint(
        server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.on("GET", "/v2/inferd/status/models/zzz", 400,
              {"error": "Request for unknown model: 'zzz' is not found"})
    code, _, err = run(server, capsys, "status", "zzz")
    assert code == 1 and err == "error: Request for unknown model: 'zzz' is not found\n"
    assert ("POST", "/v2/repository/index", None) not in server.requests


# ---- config / stats / metadata / server ----
def test_config_is_pretty_json(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "config", "ident")
    assert code == 0
    assert json.loads(out) == CONFIG and out.startswith("{\n  ")
    code, _, err = run(server, capsys, "config", "ident", "--version", "9")
    assert code == 1 and err == "error: Not Found\n"
    assert server.requests[-1][:2] == ("GET", "/v2/models/ident/versions/9/config")


def test_stats_table(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "stats")
    assert code == 0
    header, line = out.splitlines()
    assert header.split()[:6] == ["MODEL", "VERSION", "SUCCESS", "FAIL", "INFERENCES", "EXECUTIONS"]
    cells = line.split()
    assert cells[:6] == ["ident", "1", "3", "1", "6", "3"]
    # averages per request in µs: request 31396207/3, queue 447747/3, compute (all three)/3
    assert cells[6:10] == ["10465.4", "149.2", "10311.2", "0"]
    code, out, _ = run(server, capsys, "stats", "ident", "--version", "1", "--json")
    assert json.loads(out) == STATS
    assert server.requests[-1][:2] == ("GET", "/v2/models/ident/versions/1/stats")
    code, out, err = run(server, capsys, "stats", "nope")
    assert code == 1 and err == "error: requested model 'nope' is not available\n"


def test_stats_empty(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.on("GET", "/v2/models/stats", body={"model_stats": []})
    code, out, _ = run(server, capsys, "stats")
    assert code == 0 and "no model loaded" in out


def test_metadata(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "metadata", "ident")
    assert code == 0
    lines = out.splitlines()
    assert lines[:3] == ["name:     ident", "versions: 1", "platform: python"]
    assert rows("\n".join(lines[4:])) == [["KIND", "NAME", "DATATYPE", "SHAPE"],
                                          ["input", "IN", "FP32", "[-1,2]"],
                                          ["output", "OUT", "FP32", "[-1,2]"]]
    code, out, _ = run(server, capsys, "metadata", "ident", "--json")
    assert json.loads(out) == METADATA


def test_server_metadata(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "server")
    assert code == 0 and "version:    2.51.0" in out


# ---- health ----
def test_health_ready(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "health")
    assert code == 0 and out == "live: yes\nready: yes\n"
    code, out, _ = run(server, capsys, "health", "--json")
    assert code == 0 and json.loads(out) == {"live": True, "ready": True}


def test_health_not_ready(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.on("GET", "/v2/health/ready", 400, None)
    code, out, _ = run(server, capsys, "health")
    assert code == 1 and out == "live: yes\nready: no\n"
    code, out, _ = run(server, capsys, "health", "--live")
    assert code == 0 and out == "live: yes\n"
    assert server.requests[-1][1] == "/v2/health/live"


# ---- failures ----
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_names_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    for argv in (["index"], ["load", "x"], ["stats", "--json"]):
        code = ctl.main(["--url", url, *argv])
        out, err = capsys.readouterr()
        assert code == 1, argv
        assert err.startswith("error: cannot connect to the server at " + url)
        assert "connection refused" in err
    code = ctl.main(["--url", url, "health"])
    out, err = capsys.readouterr()
    assert code == 1 and "cannot connect" in err


def test_non_json_error_body(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.on("POST", "/v2/repository/index", 502, b"<html>bad gateway</html>")
    code, _, err = run(server, capsys, "index")
    assert code == 1 and err == "error: HTTP 502 Bad Gateway: <html>bad gateway</html>\n"


def test_invalid_url_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["--url", "ftp://x", "index"]) == 1
    assert "invalid server URL" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        ctl.main([])
    assert exc.value.code == 2


def test_table_alignment() -> None:
    text = table(["A", "NUM", "B"], [["x", 5, "long value"], ["yyyy", 123456, None], ["z", None, ""]])
    assert text.splitlines() == [
        "A        NUM  B",
        "x          5  long value",
        "yyyy  123456  -",
        "z          -  -",
    ]
    assert table(["X"], []) == "X"


def test_module_entry_point_starts_fast_without_heavy_imports() -> None:
    code = ("import sys, inferd.supervisor.ctl.main as m; "
            "heavy = [n for n in ('httpx', 'numpy', 'prometheus_client', 'zmq', 'grpc', 'asyncio') "
            "if n in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    res = subprocess.run([sys.executable, "-m", "inferd.supervisor.ctl", "--help"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "status" in res.stdout and "load" in res.stdout
