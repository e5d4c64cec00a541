"""Implicit sequence state with an ONNX model (the case Triton supports): the graph adds INPUT to
STATE_IN and returns the sum as OUTPUT and STATE_OUT; the sequence batcher carries STATE_OUT of one
request into STATE_IN of the next, per sequence, and batches requests of different sequences."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import framework_models as fm  # noqa: E402  (tests/ is on sys.path through the root conftest)
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

pytestmark = pytest.mark.inferd_only  # the reference Triton here has no onnxruntime backend

CONFIG = """name: "seq_onnx_state"
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 5000 }
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "start.bin" name: "start" } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
INITIAL = 1000  # initial_state data_file value


def _write_model(repo) -> None:
    from onnx import TensorProto, helper

    shape = ["batch", 1]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])],
        "seq_onnx_state",
        [helper.make_tensor_value_info("INPUT", TensorProto.INT32, shape),
         helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, shape)],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, shape),
         helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, shape)],
    )
    version = repo / "seq_onnx_state" / "1"
    version.mkdir(parents=True)
    fm._save_onnx(graph, version / "model.onnx")
    (repo / "seq_onnx_state" / "config.pbtxt").write_text(CONFIG)
    (repo / "seq_onnx_state" / "initial_state").mkdir()
    (repo / "seq_onnx_state" / "initial_state" / "start.bin").write_bytes(np.array([INITIAL], "<i4").tobytes())


@pytest.fixture(scope="module")
def server(module_server_factory):
    repo = module_server_factory.make_repo([])
    _write_model(repo)
    return module_server_factory(["seq_onnx_state"], repo=repo)


def _sequence(server, protocol: str, seq_id: int, values: list[int]) -> list[int]:
    module = httpclient if protocol == "http" else grpcclient
    client = server.http_client() if protocol == "http" else server.grpc_client()
    out = []
    try:
        for step, value in enumerate(values):
            inp = module.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            result = client.infer("seq_onnx_state", [inp], sequence_id=seq_id, sequence_start=step == 0,
                                  sequence_end=step == len(values) - 1)
            out.append(int(result.as_numpy("OUTPUT")[0][0]))
            assert result.as_numpy("STATE_OUT") is None  # the state stays in the server
    finally:
        client.close()
    return out


def test_onnx_state_is_carried_per_sequence(server):
    jobs = {8000 + i: [i + 1] * 5 for i in range(6)}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {seq_id: pool.submit(_sequence, server, "grpc" if seq_id % 2 else "http", seq_id, values)
                   for seq_id, values in jobs.items()}
        for seq_id, future in futures.items():
            step = jobs[seq_id][0]
            assert future.result(timeout=60) == [INITIAL + step * (k + 1) for k in range(5)], seq_id
