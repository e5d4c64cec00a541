"""Ensembles with optional inputs over real Python models (issue 43 item 10, Triton's qa L0_optional_input,
its composing models rewritten in Python): a step runs once the tensors it reads are present or known to be
absent (an optional input the request left out, an output a step did not produce) and gets the present
ones; an output no step produced is left out of the response, asked for or not. inferd answered 500
"ensemble ... stalled". Passes against Triton 2.51 (INFERD_E2E_TARGET=triton).

Models (written here): opt_identity (qa's identity_2_float32: OUTPUTi = INPUTi, zeros for an input not
given), opt_partial (qa's optional_identity: outputs only for the inputs given); ensembles opt_wrap (one
opt_identity step), opt_pipeline (the second step reads only INPUT1), opt_connecting (two opt_partial steps
connected by both tensors).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

IO = '''max_batch_size: 4
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] }
]
'''
ZEROS = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """qa's identity_2_float32 (the identity backend): OUTPUTi = INPUTi, zeros where INPUTi is not given."""

    def execute(self, requests):
        responses = []
        for request in requests:
            given = {i: pb_utils.get_input_tensor_by_name(request, "INPUT%d" % i) for i in (0, 1)}
            shape = next(t.as_numpy().shape for t in given.values() if t is not None)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT%d" % i, t.as_numpy() if t is not None else np.zeros(shape, np.float32))
                for i, t in given.items()]))
        return responses
'''
PARTIAL = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """qa's optional_identity: OUTPUTi = INPUTi for the inputs given, and only those."""

    def execute(self, requests):
        responses = []
        for request in requests:
            outs = []
            for i in (0, 1):
                t = pb_utils.get_input_tensor_by_name(request, "INPUT%d" % i)
                if t is not None:
                    outs.append(pb_utils.Tensor("OUTPUT%d" % i, t.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outs))
        return responses
'''


def step(model, inputs, outputs):
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs)
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs)
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def ensemble(repo, name, steps):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\n{IO}ensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n')


def build(repo: Path) -> None:
    for name, code in (("opt_identity", ZEROS), ("opt_partial", PARTIAL)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{IO}')
    both = [("INPUT0", "INPUT0"), ("INPUT1", "INPUT1")]
    outs = [("OUTPUT0", "OUTPUT0"), ("OUTPUT1", "OUTPUT1")]
    ensemble(repo, "opt_wrap", [step("opt_identity", both, outs)])
    ensemble(repo, "opt_pipeline", [step("opt_identity", both, [("OUTPUT0", "internal")]),
                                    step("opt_identity", [("INPUT1", "internal")], outs)])
    ensemble(repo, "opt_connecting", [
        step("opt_partial", both, [("OUTPUT0", "mid0"), ("OUTPUT1", "mid1")]),
        step("opt_partial", [("INPUT0", "mid0"), ("INPUT1", "mid1")], outs)])


@pytest.fixture(scope="module")
def server(module_server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("optional")
    build(repo)
    return module_server_factory(repo=repo, wait_ready=["opt_wrap", "opt_pipeline", "opt_connecting"])


ONE = np.ones((1, 1), np.float32)
TWO = np.full((1, 1), 2.0, np.float32)


def _infer(server, protocol: str, model: str, given: dict[str, np.ndarray], asked: tuple[str, ...] = ()):
    mod = httpclient if protocol == "http" else grpcclient
    client = server.http_client() if protocol == "http" else server.grpc_client()
    inputs = []
    for name, value in given.items():
        inputs.append(mod.InferInput(name, list(value.shape), "FP32"))
        inputs[-1].set_data_from_numpy(value)
    outputs = [mod.InferRequestedOutput(n) for n in asked] or None
    result = client.infer(model, inputs, outputs=outputs)
    if protocol == "http":
        names = [o["name"] for o in result.get_response()["outputs"]]
    else:
        names = [o.name for o in result.get_response().outputs]
    return {n: result.as_numpy(n).tolist() for n in names}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_runs_without_an_optional_input_left_out(server, protocol):
    """qa test_ensemble_optional_same_input / mix_inputs: one of the two inputs given."""
    assert _infer(server, protocol, "opt_wrap", {"INPUT1": TWO}, ("OUTPUT1",)) == {"OUTPUT1": [[2.0]]}
    assert _infer(server, protocol, "opt_wrap", {"INPUT0": ONE}, ("OUTPUT0",)) == {"OUTPUT0": [[1.0]]}
    assert _infer(server, protocol, "opt_wrap", {"INPUT1": TWO}) == {"OUTPUT0": [[0.0]], "OUTPUT1": [[2.0]]}
    assert _infer(server, protocol, "opt_wrap", {"INPUT0": ONE, "INPUT1": TWO}) == {"OUTPUT0": [[1.0]],
                                                                                   "OUTPUT1": [[2.0]]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_that_reads_a_subset_of_inputs(server, protocol):
    """qa test_ensemble_optional_pipeline: OUTPUT0 is always zero, OUTPUT1 = INPUT0."""
    assert _infer(server, protocol, "opt_pipeline", {"INPUT0": ONE, "INPUT1": TWO}) == {"OUTPUT0": [[0.0]],
                                                                                       "OUTPUT1": [[1.0]]}
    assert _infer(server, protocol, "opt_pipeline", {"INPUT1": TWO}) == {"OUTPUT0": [[0.0]], "OUTPUT1": [[0.0]]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_connecting_tensor_a_step_did_not_produce(server, protocol):
    """qa test_ensemble_optional_connecting_tensor: the first step produces only OUTPUT0, so the second runs
    with INPUT0 alone; an output nothing produced is left out, even when asked for."""
    assert _infer(server, protocol, "opt_connecting", {"INPUT0": ONE}, ("OUTPUT0",)) == {"OUTPUT0": [[1.0]]}
    assert _infer(server, protocol, "opt_connecting", {"INPUT0": ONE}) == {"OUTPUT0": [[1.0]]}
    assert _infer(server, protocol, "opt_connecting", {"INPUT0": ONE}, ("OUTPUT1",)) == {}
    assert _infer(server, protocol, "opt_connecting", {"INPUT1": TWO}, ("OUTPUT0", "OUTPUT1")) == {"OUTPUT1": [[2.0]]}
