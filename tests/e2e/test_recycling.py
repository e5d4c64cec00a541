"""Recycling and gap-free replacement of workers (issue 41 items 2 and 4) through a real server under a
closed-loop load (4 tritonclient threads): a model's INFERD_MAX_REQUESTS recycles its workers and no request
fails, the restarts metric counts them as "recycled", nothing is left in /dev/shm; `infer-ctl restart`
replaces every worker the same way; `infer-ctl log-level` shows and changes the runtime log settings; a
reload through the load API (new config, new files) or poll mode (a new version) fails no request: those two
tests run against Triton 2.51 too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from closed_loop import ClosedLoop, fp32_input
from conftest import http_get, leak_diff, pid_alive, shm_snapshot, target_is_triton, wait_for

inferd_only = pytest.mark.skipif(target_is_triton(), reason="inferd's recycling, restart and infer-ctl")

INFER_CTL = [sys.executable, "-m", "inferd.supervisor.ctl"]
SLEEP_S = 0.002  # each request holds its worker a little, so replacements happen with work in flight


def _parameter(repo: Path, model: str, key: str, value: str) -> None:
    config = repo / model / "config.pbtxt"
    config.write_text(config.read_text() + f'\nparameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n')


def _status(server, model: str) -> list[dict]:
    code, body = server.get(f"/v2/inferd/status/models/{model}")
    assert code == 200, body
    return [i for m in json.loads(body)["models"] for i in m["instances"] or []]


def _recycled(server, model: str) -> int:
    return sum(i["restart_reasons"].get("recycled", 0) for i in _status(server, model))


def _metric_recycled(server, model: str) -> int:
    _, text = http_get(server.metrics_url)
    found = re.findall(rf'^inferd_instance_restarts_total\{{[^}}]*model="{model}",reason="recycled"[^}}]*\}} (\d+)',
                       text.decode(), re.M)
    return sum(int(n) for n in found)


def _ready_versions(server, model: str) -> list[str]:
    code, body = server.post("/v2/repository/index", b'{"ready": true}')
    return [m["version"] for m in json.loads(body) if m["name"] == model] if code == 200 else []


def _load(server, model: str = "sleep") -> ClosedLoop:
    return ClosedLoop(server.http_url, model, fp32_input("INPUT0", SLEEP_S), threads=4, pid_output="PID").start()


def _ctl(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*INFER_CTL, "--url", server.http_base, *args], capture_output=True, text=True,
                          timeout=120)


@inferd_only
def test_max_requests_recycles_under_load_and_fails_nothing(server_factory):
    repo = server_factory.make_repo(["sleep"])
    _parameter(repo, "sleep", "INFERD_MAX_REQUESTS", "40")
    server = server_factory(repo=repo, wait_ready=["sleep"])
    first = {i["pid"] for i in _status(server, "sleep")}
    shm_before = shm_snapshot()
    load = _load(server)
    try:  # 2 instances, each recycled twice: after ~40 and ~80 of its requests
        wait_for(lambda: _recycled(server, "sleep") >= 4, 120, "4 recycles", interval=0.05)
    finally:
        answers = load.stop()
    failures = [a.error for a in answers if a.error]
    assert not failures, failures[:5]
    served_by = {a.pid for a in answers}
    assert len(served_by) >= 4, served_by  # the first workers and replacements all answered
    assert first <= served_by
    wait_for(lambda: all(i["state"] == "ready" and not i["inflight"] for i in _status(server, "sleep")), 30,
             "the instances settled")
    now = {i["pid"] for i in _status(server, "sleep")}
    for pid in served_by - now:
        wait_for(lambda pid=pid: not pid_alive(pid), 30, f"the replaced worker {pid} to exit")
    assert _metric_recycled(server, "sleep") == _recycled(server, "sleep") >= 4
    assert all(i["restart_reasons"].get("exit", 0) == 0 for i in _status(server, "sleep"))
    owners = served_by | {server.pid}
    assert not leak_diff(shm_before, shm_snapshot(), owners), leak_diff(shm_before, shm_snapshot(), owners)


@inferd_only
def test_infer_ctl_restart_replaces_every_worker_under_load(server_factory):
    server = server_factory(["sleep"])
    before = {i["name"]: i["pid"] for i in _status(server, "sleep")}
    load = _load(server)
    try:
        wait_for(lambda: load.count() >= 20, 60, "the load running")
        done = _ctl(server, "restart", "sleep", "--json")
        after = {r["pid_after"] for r in json.loads(done.stdout or '{"instances": []}')["instances"]}
        seen = load.count()
        wait_for(lambda: load.count() >= seen + 20, 60, "answers after the restart")
    finally:
        answers = load.stop()
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["instances"]
    assert {r["name"] for r in rows} == set(before)
    for row in rows:
        assert row["restarted"] is True and row["pid_before"] == before[row["name"]], row
        assert row["pid_after"] not in (None, row["pid_before"]), row
        assert not pid_alive(row["pid_before"])  # the old one has stopped by the time the call answers
    assert not [a.error for a in answers if a.error]
    assert {a.pid for a in answers[seen + 4:]} <= after  # (after the call and its last 4 in flight: the new)
    assert _metric_recycled(server, "sleep") == 2
    table = _ctl(server, "restart", "sleep")  # the human form: a table, exit 0
    assert table.returncode == 0 and "RESTARTED" in table.stdout and "yes" in table.stdout, table
    missing = _ctl(server, "restart", "no_such_model")
    assert missing.returncode == 1 and "no_such_model" in missing.stderr, missing


@inferd_only
def test_infer_ctl_log_level_shows_and_changes_the_settings(server_factory):
    server = server_factory(["sleep"])
    shown = _ctl(server, "log-level")
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^log_verbose_level\s+0$", shown.stdout, re.M), shown.stdout
    changed = _ctl(server, "log-level", "--verbose", "2", "--info", "off", "--json")
    assert changed.returncode == 0, changed.stderr
    doc = json.loads(changed.stdout)
    assert doc["log_verbose_level"] == 2 and doc["log_info"] is False
    _, body = http_get(server.http_base + "/v2/logging")
    assert json.loads(body)["log_verbose_level"] == 2
    refused = _ctl(server, "log-level", "--verbose", "-1")
    assert refused.returncode == 1 and "log_verbose_level" in refused.stderr, refused


def test_reload_under_load_fails_nothing(server_factory):
    server = server_factory(["sleep"], control_mode="explicit", load_models=["sleep"])
    client = server.http_client()
    config = client.get_model_config("sleep")
    model_py = (server.repo / "sleep" / "1" / "model.py").read_bytes()
    load = _load(server)
    try:
        wait_for(lambda: load.count() >= 20, 60, "the load running")
        pids = {a.pid for a in load.answers}
        for n in range(3):  # a new config (a changed parameter) each time, the last with new files too
            config["parameters"] = {"GENERATION": {"string_value": str(n)}}
            files = {"file:1/model.py": model_py + f"\n# generation {n}\n".encode()} if n == 2 else {}
            client.load_model("sleep", config=json.dumps(config), files=files)
            seen = load.count()
            wait_for(lambda seen=seen: load.count() >= seen + 10, 60, "answers after the reload")
    finally:
        answers = load.stop()
        client.close()
    assert not [a.error for a in answers if a.error], [a.error for a in answers if a.error][:5]
    assert len({a.pid for a in answers} - pids) >= 6  # every reload's workers answered


@inferd_only
def test_malformed_recycling_parameter_fails_the_load_naming_it(server_factory):
    repo = server_factory.make_repo(["sleep"])
    _parameter(repo, "sleep", "INFERD_MAX_AGE", "soon")
    server = server_factory(repo=repo, control_mode="explicit", wait_ready=[])
    code, body = server.post("/v2/repository/models/sleep/load")
    assert code == 400 and b"INFERD_MAX_AGE" in body, body


def test_poll_mode_reload_of_a_new_version_under_load_fails_nothing(server_factory, tmp_path):
    server = server_factory(["sleep"], control_mode="poll", extra_args=["--repository-poll-secs", "1"])
    load = _load(server)
    try:
        wait_for(lambda: load.count() >= 20, 60, "the load running")
        staged = tmp_path / "2"
        shutil.copytree(server.repo / "sleep" / "1", staged)
        staged.rename(server.repo / "sleep" / "2")  # whole at once: a scan never sees half a version
        wait_for(lambda: _ready_versions(server, "sleep") == ["2"], 60, "version 2 serving alone")
        seen = load.count()
        wait_for(lambda: load.count() >= seen + 20, 60, "answers after the reload")
    finally:
        answers = load.stop()
    assert not [a.error for a in answers if a.error], [a.error for a in answers if a.error][:5]


@inferd_only
def test_restart_is_in_the_model_repository_restricted_category(server_factory):
    server = server_factory(["sleep"], extra_args=["--http-restricted-api=model-repository:admin-key=s3cret"])
    code, body = server.post("/v2/inferd/models/sleep/restart")
    assert code == 403 and b"admin-key" in body, (code, body)
    refused = _ctl(server, "restart", "sleep")
    assert refused.returncode == 1 and "admin-key" in refused.stderr, refused
    done = _ctl(server, "--header", "admin-key=s3cret", "restart", "sleep", "--json")
    assert done.returncode == 0 and all(r["restarted"] for r in json.loads(done.stdout)["instances"]), done
