"""Sequence batcher end to end with unmodified tritonclient (HTTP and gRPC): running sums per
correlation id under the direct and oldest strategies, the control values the model sees, instance
pinning, batching across sequences, START rules, string ids, idle release and implicit state.

Fixture models: seq_accumulate (direct, max_batch_size 4, 2 instances; echoes START/END/READY/CORRID,
its pid and the batch size it saw) and seq_state (implicit state). Variants are made by editing a copy
of the config (oldest strategy, string CORRID, a short idle time)."""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

DIRECT, OLDEST, STRING, IDLE = "seq_direct", "seq_oldest", "seq_string", "seq_idle"
IDLE_US = 300_000
OUTPUTS = ["OUTPUT", "START_OUT", "END_OUT", "READY_OUT", "CORRID_OUT", "PID", "BATCH"]


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def server(module_server_factory):
    models = {DIRECT: "seq_accumulate", OLDEST: "seq_accumulate", STRING: "seq_accumulate",
              IDLE: "seq_accumulate", "seq_state": "seq_state"}
    repo = module_server_factory.make_repo(models)
    _edit(repo / OLDEST / "config.pbtxt", "direct { }",
          "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000 }")
    _edit(repo / STRING / "config.pbtxt", "data_type: TYPE_UINT64 } ]", "data_type: TYPE_STRING } ]")
    _edit(repo / STRING / "config.pbtxt", '"CORRID_OUT" data_type: TYPE_UINT64', '"CORRID_OUT" data_type: TYPE_STRING')
    _edit(repo / IDLE / "config.pbtxt", "max_sequence_idle_microseconds: 5000000",
          f"max_sequence_idle_microseconds: {IDLE_US}")
    _edit(repo / IDLE / "config.pbtxt", "count: 2", "count: 1")
    return module_server_factory(models, repo=repo)


def infer(client, module, model: str, seq_id, value: int, start: bool = False, end: bool = False,
          sleep_ms: int = 0) -> dict:
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    kwargs = {"parameters": {"SLEEP_MS": sleep_ms}} if sleep_ms else {}
    result = client.infer(model, [inp], sequence_id=seq_id, sequence_start=start, sequence_end=end, **kwargs)
    names = OUTPUTS if model != "seq_state" else ["OUTPUT"]
    return {n: result.as_numpy(n)[0][0] for n in names}


def clients(server):
    return {"http": (server.http_client(), httpclient), "grpc": (server.grpc_client(), grpcclient)}


@pytest.mark.parametrize("model", [DIRECT, OLDEST])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_keep_separate_sums_and_see_their_controls(server, model, protocol):
    client, module = clients(server)[protocol]
    ids = [1001, 1002, 2**63 + 5]  # a uint64 id above INT64_MAX works over HTTP; gRPC ids are int64
    if protocol == "grpc":
        ids[2] = 2**62 + 5
    sums = dict.fromkeys(ids, 0)
    pids: dict[int, set] = {i: set() for i in ids}
    steps = 4
    for step in range(steps):
        for k, seq_id in enumerate(ids):
            value = (k + 1) * 100 + step
            sums[seq_id] += value
            out = infer(client, module, model, seq_id, value, start=step == 0, end=step == steps - 1)
            assert out["OUTPUT"] == sums[seq_id], (seq_id, step)
            assert (out["START_OUT"], out["END_OUT"], out["READY_OUT"]) == (int(step == 0), int(step == steps - 1), 1)
            assert int(out["CORRID_OUT"]) == seq_id
            pids[seq_id].add(int(out["PID"]))
    # each sequence ran on one instance only
    assert all(len(p) == 1 for p in pids.values()), pids


def test_direct_strategy_pins_sequences_across_both_instances(server):
    client, module = clients(server)["grpc"]
    ids = list(range(3001, 3009))
    seen: dict[int, set] = {i: set() for i in ids}
    for step in range(3):
        for seq_id in ids:
            out = infer(client, module, DIRECT, seq_id, 1, start=step == 0, end=step == 2)
            seen[seq_id].add(int(out["PID"]))
            assert out["OUTPUT"] == step + 1
    assert all(len(p) == 1 for p in seen.values()), seen
    assert len(set().union(*seen.values())) == 2  # the sequences were spread over the 2 instances


def _run_sequence(server, model: str, seq_id: int, steps: int, sleep_ms: int) -> list[dict]:
    client = server.grpc_client()
    try:
        return [infer(client, grpcclient, model, seq_id, 1, start=s == 0, end=s == steps - 1, sleep_ms=sleep_ms)
                for s in range(steps)]
    finally:
        client.close()


def _stats(server, model: str) -> dict:
    code, body = server.get(f"/v2/models/{model}/stats")
    assert code == 200
    return json.loads(body)["model_stats"][0]


@pytest.mark.parametrize("model", [DIRECT, OLDEST])
def test_concurrent_sequences_are_batched(server, model):
    before = _stats(server, model)
    n_seq, steps = 8, 4
    with concurrent.futures.ThreadPoolExecutor(n_seq) as pool:
        runs = list(pool.map(lambda i: _run_sequence(server, model, 4000 + i, steps, 100), range(n_seq)))
    for outs in runs:
        assert [o["OUTPUT"] for o in outs] == list(range(1, steps + 1))
    assert max(o["BATCH"] for outs in runs for o in outs) > 1
    after = _stats(server, model)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == n_seq * steps
    assert executions < inferences  # batches of several sequences ran


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_without_start_are_refused(server, protocol):
    client, module = clients(server)[protocol]
    with pytest.raises(InferenceServerException, match="must specify the START flag on the first request"):
        infer(client, module, DIRECT, 5555, 1)
    infer(client, module, DIRECT, 5556, 1, start=True, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        infer(client, module, DIRECT, 5556, 1)  # the sequence has ended
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        infer(client, module, DIRECT, 0, 1, start=True)
    assert server.alive()


# Triton 2.51 fails a direct-strategy batch holding a TYPE_STRING CORRID and a null request ("unexpected
# number of string elements 2 for inference input 'CORRID'"), so this runs against inferd only
@pytest.mark.inferd_only
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_correlation_ids(server, protocol):
    client, module = clients(server)[protocol]
    ids = [f"{protocol}-alpha", f"{protocol}-beta"]
    for step in range(3):
        for k, seq_id in enumerate(ids):
            out = infer(client, module, STRING, seq_id, k + 1, start=step == 0, end=step == 2)
            assert out["OUTPUT"] == (k + 1) * (step + 1)
            assert out["CORRID_OUT"] == seq_id.encode()


@pytest.mark.inferd_only  # the released-for-idleness message is inferd's
def test_idle_sequence_is_released(server):
    client, module = clients(server)["http"]
    infer(client, module, IDLE, 6001, 5, start=True)
    server.wait_until(lambda: "sequence 6001 for model 'seq_idle' had no request" in server.log(), 30,
                      "the idle sequence to be released")
    with pytest.raises(InferenceServerException, match="released after 300000 microseconds"):
        infer(client, module, IDLE, 6001, 1)
    assert infer(client, module, IDLE, 6001, 7, start=True, end=True)["OUTPUT"] == 7  # a new START works


@pytest.mark.inferd_only  # Triton's Python backend does not carry implicit state
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_implicit_state_is_carried_between_requests(server, protocol):
    client, module = clients(server)[protocol]
    ids = [7001, 7002]
    sums = dict.fromkeys(ids, 0)
    for step in range(4):
        for k, seq_id in enumerate(ids):
            value = (k + 1) * 10 + step
            sums[seq_id] += value
            out = infer(client, module, "seq_state", seq_id, value, start=step == 0, end=step == 3)
            assert out["OUTPUT"] == sums[seq_id]
    # the state output never reaches the client
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    result = client.infer("seq_state", [inp], sequence_id=7003, sequence_start=True, sequence_end=True)
    response = result.get_response()
    names = [o["name"] for o in response["outputs"]] if protocol == "http" else [o.name for o in response.outputs]
    assert names == ["OUTPUT"]


@pytest.mark.parametrize("model", [DIRECT, OLDEST])
def test_sequences_over_one_grpc_stream(server, model):
    """The usual streaming client: several sequences interleaved on one ModelStreamInfer stream."""
    import queue

    results: queue.Queue = queue.Queue()
    client = server.grpc_client()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    ids = [8101, 8102, 8103]
    expected = {}
    try:
        for step in range(3):
            for k, seq_id in enumerate(ids):
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.array([[k + 1]], dtype=np.int32))
                request_id = f"{seq_id}-{step}"
                expected[request_id] = (k + 1) * (step + 1)
                client.async_stream_infer(model, [inp], request_id=request_id, sequence_id=seq_id,
                                          sequence_start=step == 0, sequence_end=step == 2)
        got = {}
        for _ in expected:
            result, error = results.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
        assert got == expected
    finally:
        client.stop_stream()
        client.close()
