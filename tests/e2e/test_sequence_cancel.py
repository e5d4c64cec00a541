"""Cancelling a queued request of a sequence (gRPC client timeout) ends that sequence: the cancelled
request and the ones queued behind it never run, later requests of the sequence need START again,
and the server stays healthy with no shared memory left behind."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "seq_accumulate"
SLOW_MS = 3000  # the running request; the queued one times out long before it ends


def _input(value: int):
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [inp]


def _inference_count(server) -> int:
    code, body = server.get(f"/v2/models/{MODEL}/stats")
    assert code == 200
    return json.loads(body)["model_stats"][0]["inference_count"]


@pytest.mark.inferd_only  # inspects inferd's shm names and its end-the-sequence rule
def test_cancelled_queued_request_ends_its_sequence(server_factory, harness):
    server = server_factory([MODEL])
    shm_before = harness.shm_snapshot()
    client = server.grpc_client()
    seq = 9001
    client.infer(MODEL, _input(1), sequence_id=seq, sequence_start=True)
    counted = _inference_count(server)

    slow: queue.Queue = queue.Queue()
    client.async_infer(MODEL, _input(10), lambda result, error: slow.put((result, error)), sequence_id=seq,
                       parameters={"SLEEP_MS": SLOW_MS})
    server.wait_until(lambda: sum(i.get("inflight", 0) for i in server.instances(MODEL)) == 1, 30,
                      "the slow request to run")
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        client.infer(MODEL, _input(100), sequence_id=seq, client_timeout=0.3)
    result, error = slow.get(timeout=30)
    assert error is None and result.as_numpy("OUTPUT")[0][0] == 11  # the slow one finished normally
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer(MODEL, _input(1000), sequence_id=seq)
    assert _inference_count(server) == counted + 1  # the cancelled request never ran
    out = client.infer(MODEL, _input(5), sequence_id=seq, sequence_start=True, sequence_end=True)
    assert out.as_numpy("OUTPUT")[0][0] == 5
    assert server.is_live()
    owners = server.remember_pids()
    server.wait_until(lambda: harness.leak_free(shm_before, harness.shm_snapshot(), owners), 30,
                      "no shared memory left behind")
