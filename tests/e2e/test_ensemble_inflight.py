"""ensemble_scheduling.max_inflight_requests (triton.md §3.8): the responses of a decoupled step
have at most that many requests running in the later steps at once; without it, as many as the
later step's instances take. The field came after Triton 2.51 (its config parser refuses it), so this
runs against inferd only."""

from __future__ import annotations

import json
import queue
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import FIXTURE_MODELS

pytestmark = pytest.mark.inferd_only

OVERLAP = '''
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(os.path.dirname(args["model_repository"]), "overlap.jsonl")

    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.3)
        with open(self.log, "a") as f:
            f.write(json.dumps([start, time.monotonic()]) + "\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
'''

ENSEMBLE = '''name: "{name}"
platform: "ensemble"
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{ {limit} step [
  {{ model_name: "decoupled_repeat" model_version: -1 input_map {{ key: "IN" value: "N" }}
    output_map {{ key: "OUT" value: "i" }} }},
  {{ model_name: "overlap" model_version: -1 input_map {{ key: "X" value: "i" }}
    output_map {{ key: "Y" value: "OUT" }} }}
] }}
'''


def most_at_once(intervals: list[list[float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def stream(server, model: str, n: int) -> list[int]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        inp = grpcclient.InferInput("N", [1], "INT32")
        inp.set_data_from_numpy(np.array([n], dtype=np.int32))
        client.async_stream_infer(model, [inp], enable_empty_final_response=True)
        values = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return sorted(values)
            values.append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
        client.close()


def test_max_inflight_requests_bounds_the_later_steps(server_factory, tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(FIXTURE_MODELS / "decoupled_repeat", repo / "decoupled_repeat",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "overlap" / "1").mkdir(parents=True)
    (repo / "overlap" / "1" / "model.py").write_text(OVERLAP)
    (repo / "overlap" / "config.pbtxt").write_text(
        'name: "overlap"\nbackend: "python"\ninput [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'instance_group [ { count: 4 kind: KIND_CPU } ]\n')
    for name, limit in (("ens_limited", "max_inflight_requests: 2"), ("ens_free", "")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name, limit=limit))
    server = server_factory(repo=repo, wait_ready=["ens_limited", "ens_free"])
    log = repo / "overlap.jsonl"

    assert stream(server, "ens_limited", 6) == [0, 1, 2, 3, 4, 5]
    limited = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    assert stream(server, "ens_free", 6) == [0, 1, 2, 3, 4, 5]
    free = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(limited) == len(free) == 6
    assert most_at_once(limited) <= 2
    assert most_at_once(free) > 2
