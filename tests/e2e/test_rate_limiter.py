"""Triton's rate limiter on real servers (`--rate-limit=execution_count`, docs/rate-limiter.md): models sharing
one copy of a resource never execute at once, whatever schedules them (default scheduler, dynamic batcher,
sequence batcher, ensemble steps); priority 2 gets half the turns of priority 1; the wait is queue time in
the statistics; a group without rate_limiter is not held back; resources that cannot be had fail the load
with Triton's messages. The fixture model `rate_probe` reports each execution's start and end
(time.monotonic_ns, one clock for every process on the host). Every test passes against Triton 2.51 too
(INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

LIMIT = ["--rate-limit", "execution_count"]
Execution = tuple[int, int, str]  # start ns, end ns, model


def group(resources: str = "", priority: int = 0, limited: bool = True) -> str:
    limiter = f"rate_limiter {{ resources [ {resources} ] priority: {priority} }}" if limited else ""
    return f"instance_group [ {{ count: 1 kind: KIND_CPU {limiter} }} ]\n"


ONE_R = '{ name: "R" count: 1 }'


def add_probe(repo: Path, name: str, extra: str) -> None:
    """A copy of rate_probe named `name` with `extra` appended to its config."""
    src = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "rate_probe"
    dest = repo / name
    (dest / "1").mkdir(parents=True)
    (dest / "1" / "model.py").write_text((src / "1" / "model.py").read_text())
    config = (src / "config.pbtxt").read_text().replace('name: "rate_probe"', f'name: "{name}"')
    (dest / "config.pbtxt").write_text(config + extra)


def infer(client: Any, model: str, seconds: float, **kw: Any) -> tuple[int, int, int]:
    import tritonclient.http as httpclient

    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[seconds]], np.float32))
    result = client.infer(model, [x], **kw)
    return int(result.as_numpy("START")[0, 0]), int(result.as_numpy("END")[0, 0]), int(result.as_numpy("BATCH")[0, 0])


def run_clients(server: Any, work: dict[str, Any], threads_per_model: int) -> list[BaseException]:
    """Run `work[model](client)` in `threads_per_model` threads per model; the errors they raised."""
    errors: list[BaseException] = []

    def body(fn: Any) -> None:
        client = server.http_client()
        try:
            fn(client)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=body, args=(fn,)) for fn in work.values() for _ in range(threads_per_model)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def overlaps(executions: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of distinct executions that ran at the same time (a batch's requests share one execution)."""
    distinct = sorted(set(executions))
    found = []
    latest: Execution | None = None
    for e in distinct:
        if latest is not None and e[0] < latest[1]:
            found.append((latest, e))
        if latest is None or e[1] > latest[1]:
            latest = e
    return found


# ---- one copy of R: default scheduler, dynamic batcher, sequence batcher, ensemble steps ----

ENSEMBLE = """name: "ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "A_START" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "A_END" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "B_START" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "B_END" data_type: TYPE_INT64 dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "plain" model_version: -1 input_map { key: "X" value: "X" }
    output_map { key: "START" value: "A_START" } output_map { key: "END" value: "A_END" } },
  { model_name: "batched" model_version: -1 input_map { key: "X" value: "X" }
    output_map { key: "START" value: "B_START" } output_map { key: "END" value: "B_END" } }
] }
"""


def _shared_repo(factory: Any) -> Path:
    repo = factory.make_repo([])
    add_probe(repo, "plain", group(ONE_R))
    add_probe(repo, "batched", group(ONE_R) + "dynamic_batching { }\n")
    add_probe(repo, "seq", group(ONE_R, priority=3) + "sequence_batching { max_sequence_idle_microseconds: "
                                                       "60000000 }\n")
    (repo / "ensemble" / "1").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return repo


def _hammer(server: Any) -> list[Execution]:
    """Two clients per model, each sending three 60 ms requests (the ensemble: both steps at once)."""
    executions: list[Execution] = []
    lock = threading.Lock()
    corr = iter(range(1000, 2000))

    def plain_or_batched(model: str) -> Any:
        def work(client: Any) -> None:
            for _ in range(3):
                start, end, _ = infer(client, model, 0.06)
                with lock:
                    executions.append((start, end, model))
        return work

    def sequence(client: Any) -> None:
        with lock:
            cid = next(corr)
        for i in range(3):
            start, end, _ = infer(client, "seq", 0.06, sequence_id=cid, sequence_start=i == 0, sequence_end=i == 2)
            with lock:
                executions.append((start, end, "seq"))

    def ensemble(client: Any) -> None:
        import tritonclient.http as httpclient

        for _ in range(3):
            x = httpclient.InferInput("X", [1, 1], "FP32")
            x.set_data_from_numpy(np.array([[0.06]], np.float32))
            r = client.infer("ensemble", [x])
            with lock:
                executions.append((int(r.as_numpy("A_START")[0, 0]), int(r.as_numpy("A_END")[0, 0]), "plain"))
                executions.append((int(r.as_numpy("B_START")[0, 0]), int(r.as_numpy("B_END")[0, 0]), "batched"))

    errors = run_clients(server, {"plain": plain_or_batched("plain"), "batched": plain_or_batched("batched"),
                                  "seq": sequence, "ensemble": ensemble}, threads_per_model=2)
    assert not errors, errors
    return executions


def test_models_sharing_one_copy_never_execute_at_once(server_factory):
    repo = _shared_repo(server_factory)
    models = ["plain", "batched", "seq", "ensemble"]
    server = server_factory(repo=repo, models=models, extra_args=LIMIT)
    executions = _hammer(server)
    assert {m for _, _, m in executions} == {"plain", "batched", "seq"}
    assert overlaps(executions) == []
    server.stop()
    # the same load without the rate limiter overlaps: the check above can see it
    free = server_factory(repo=repo, models=models, extra_args=["--rate-limit", "off"])
    assert overlaps(_hammer(free)) != []


# ---- priority ----

def test_priority_2_gets_half_the_turns_of_priority_1(server_factory):
    repo = server_factory.make_repo([])
    add_probe(repo, "first", group(ONE_R, priority=1))
    add_probe(repo, "second", group(ONE_R, priority=2))
    server = server_factory(repo=repo, models=["first", "second"], extra_args=LIMIT)
    with server.http_client() as client:
        groups = client.get_model_config("second")["instance_group"]
    assert groups[0]["rate_limiter"] == {"resources": [{"name": "R", "global": False, "count": 1}], "priority": 2}

    executions: list[Execution] = []
    lock = threading.Lock()
    stop = threading.Event()

    def work(model: str) -> Any:
        def loop(client: Any) -> None:
            while not stop.is_set():
                start, end, _ = infer(client, model, 0.03)
                with lock:
                    executions.append((start, end, model))
                    if len(executions) >= 60:
                        stop.set()
        return loop

    # three clients per model: each always has requests waiting when R comes free
    errors = run_clients(server, {"first": work("first"), "second": work("second")}, threads_per_model=3)
    assert not errors, errors
    assert overlaps(executions) == []
    turns = [m for _, _, m in sorted(executions)][5:50]  # the first few: clients still starting
    share = turns.count("first")
    assert 27 <= share <= 33, f"priority 1 ran {share} of {len(turns)} turns (expected about 2/3): {turns}"


# ---- queue time and unlimited groups ----

def test_the_wait_is_queue_time_and_groups_without_rate_limiter_go_on(server_factory, tmp_path, harness):
    repo = server_factory.make_repo([])
    add_probe(repo, "holder", group(ONE_R))
    add_probe(repo, "waiter", group(ONE_R))
    add_probe(repo, "free", group(limited=False))
    server = server_factory(repo=repo, models=["holder", "waiter", "free"], extra_args=LIMIT)
    started = tmp_path / "holder-started"
    held: dict[str, Any] = {}

    def hold() -> None:
        with server.http_client() as client:
            held["times"] = infer(client, "holder", 3.0, parameters={"started_file": str(started)})

    holder = threading.Thread(target=hold)
    holder.start()
    server.wait_until(started.exists, 30, "the holder's execution to start")
    with server.http_client() as client:
        free_times = [infer(client, "free", 0.0)]  # R is held: a group without rate_limiter runs anyway
    waited: dict[str, Any] = {}

    def wait() -> None:
        with server.http_client() as client:
            waited["times"] = infer(client, "waiter", 0.0)

    waiter = threading.Thread(target=wait)
    waiter.start()
    pending = 'nv_inference_pending_request_count{model="waiter",version="1"} 1'
    server.wait_until(lambda: pending in server.metrics(), 30, "the waiter to wait for R")
    seen_waiting = time.monotonic_ns()  # the waiter's request arrived before this
    if not harness.target_is_triton():
        # inferd never holds an unlimited instance back, not even behind an instance waiting for its resources
        # (Triton 2.51 grants in one queue and runs it after the waiter: docs/rate-limiter.md)
        with server.http_client() as client:
            free_times.append(infer(client, "free", 0.0))
    holder.join(timeout=60)
    waiter.join(timeout=60)
    holder_start, holder_end, _ = held["times"]
    for free_start, free_end, _ in free_times:
        assert holder_start < free_start and free_end < holder_end, (held, free_times)
    assert waited["times"][0] >= holder_end  # waited for R

    with server.http_client() as client:
        stats = client.get_inference_statistics("waiter")["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == 1
    must_have_waited = holder_end - seen_waiting
    assert must_have_waited > 500_000_000  # (the holder sleeps 3 s; the waiter came soon after it began)
    assert int(stats["queue"]["ns"]) >= must_have_waited, (stats, must_have_waited)


# ---- load errors ----

def test_resources_that_cannot_be_had_fail_the_load_with_tritons_messages(server_factory):
    repo = server_factory.make_repo([])
    add_probe(repo, "fine", group(ONE_R))
    add_probe(repo, "big", group('{ name: "R" count: 4 }'))
    add_probe(repo, "elsewhere", group('{ name: "Q" count: 1 }'))  # Q exists on device 10 only
    add_probe(repo, "g_global", group('{ name: "G" global: true count: 2 }'))
    add_probe(repo, "g_device", group('{ name: "G" count: 2 }'))
    server = server_factory(repo=repo, models=["fine"], extra_args=[
        *LIMIT, "--rate-limit-resource", "R:1", "--rate-limit-resource=Q:10:10", "--rate-limit-resource", "G:2"])

    def index() -> dict[str, dict[str, Any]]:
        code, body = server.post("/v2/repository/index")
        assert code == 200
        return {row["name"]: row for row in json.loads(body)}

    rows = server.wait_until(lambda: (r := index()) and all(r[m].get("state") in ("READY", "UNAVAILABLE") for m in
                                                             ("big", "elsewhere", "g_global", "g_device")) and r,
                             60, "every load to end")
    assert rows["fine"]["state"] == "READY"
    for name, resource, limited, needed in (("big", "R", 1, 4), ("elsewhere", "Q", 0, 1)):
        assert rows[name]["state"] == "UNAVAILABLE"
        assert (f'Resource count for "{resource}" is limited to {limited} which will prevent scheduling of one or more '
                f"model instances, the minimum required count is {needed}") in rows[name]["reason"]
    conflict = 'Resource "G" is present as both global and device-specific resource in the model configuration.'
    states = sorted((rows[m]["state"], conflict in rows[m].get("reason", "")) for m in ("g_global", "g_device"))
    assert states == [("READY", False), ("UNAVAILABLE", True)], rows  # whichever loaded second
