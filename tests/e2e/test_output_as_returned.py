"""A Python model's outputs reach the client as the model produced them (datatype and shape), whatever
the configuration declares, as Triton 2.51 does; alone or in a dynamic batch. Unmodified tritonclient;
passes against the real Triton too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

X = np.arange(4, dtype=np.int32).reshape(1, 4)
# mode -> (datatype, shape, values) the client sees for X
EXPECTED = {
    "": ("INT32", [1, 4], X),
    "int64": ("INT64", [1, 4], X.astype(np.int64)),
    "float32": ("FP32", [1, 4], X.astype(np.float32)),
    "stacked": ("INT32", [2, 1, 4], np.stack([X, X])),
    "unbatched": ("INT32", [4], X[0]),
    "bytes": ("BYTES", [4], np.array([b"0", b"1", b"2", b"3"], dtype=np.object_)),
}


# step 1 returns OUT as it likes; step 2 (the same model) checks its input IN against its configuration
CHAIN = """name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "output_as_returned" model_version: -1 input_map { key: "IN" value: "IN" }
    output_map { key: "OUT" value: "mid" } },
  { model_name: "step_two" model_version: -1 input_map { key: "IN" value: "mid" }
    output_map { key: "OUT" value: "OUT" } }
] }
"""


@pytest.fixture(scope="module")
def server(module_server_factory):
    repo = module_server_factory.make_repo({"output_as_returned": "output_as_returned",
                                            "step_two": "output_as_returned"})
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)
    return module_server_factory(repo=repo, wait_ready=["output_as_returned", "step_two", "chain"])


def _input(mod):
    inp = mod.InferInput("IN", [1, 4], "INT32")
    inp.set_data_from_numpy(X)
    return inp


def _seen(result, protocol):
    if protocol == "http":
        out = result.get_response()["outputs"][0]
        return out["datatype"], out["shape"]
    out = result.get_response().outputs[0]
    return out.datatype, list(out.shape)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_output_as_the_model_returned_it(server, protocol, mode):
    mod = httpclient if protocol == "http" else grpcclient
    client = server.http_client() if protocol == "http" else server.grpc_client()
    result = client.infer("output_as_returned", [_input(mod)], parameters={"mode": mode})
    datatype, shape, values = EXPECTED[mode]
    assert _seen(result, protocol) == (datatype, shape)
    got = result.as_numpy("OUT")
    assert got.shape == tuple(shape)
    np.testing.assert_array_equal(got, values)
    client.close()


@pytest.mark.parametrize("modes", [["int64"] * 4, ["int64", "", "stacked", "bytes", "unbatched"]],
                         ids=["alike", "mixed"])
def test_batched_requests_each_get_their_own(server, modes):
    """Requests sharing an execute (dynamic batching): each response keeps its own datatype and shape."""
    client = server.http_client(concurrency=len(modes))
    before = _counts(client)
    pending = [client.async_infer("output_as_returned", [_input(httpclient)], parameters={"mode": m})
               for m in modes]
    for mode, job in zip(modes, pending):
        result = job.get_result(timeout=60)
        datatype, shape, values = EXPECTED[mode]
        assert _seen(result, "http") == (datatype, shape)
        np.testing.assert_array_equal(result.as_numpy("OUT"), values)
    inferences, executions = (a - b for a, b in zip(_counts(client), before))
    assert inferences == len(modes) and executions < inferences  # some requests did share an execute
    client.close()


def _counts(client) -> tuple[int, int]:
    stats = client.get_inference_statistics("output_as_returned")["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


@pytest.mark.parametrize("mode, error", [("", None), ("int64", "data-type is 'INT64', but model 'step_two' expects"
                                                               " 'INT32'")])
def test_ensemble_next_step_gets_the_real_tensor(server, mode, error):
    """The tensor the first step returned is what the second step is given; its own checks then apply."""
    client = server.http_client()
    if error is None:
        result = client.infer("chain", [_input(httpclient)], parameters={"mode": mode})
        np.testing.assert_array_equal(result.as_numpy("OUT"), X)
    else:
        with pytest.raises(InferenceServerException, match=error):
            client.infer("chain", [_input(httpclient)], parameters={"mode": mode})
    client.close()
