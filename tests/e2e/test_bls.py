"""BLS end to end: Python models calling other models through inferd (unmodified tritonclient outside,
unmodified pb_utils inside): sync, several concurrent async_exec, decoupled iteration, errors from the
callee, timeouts, self-calls that would deadlock, model control from a model, large tensors passed by
handle, and the preprocess -> ONNX -> postprocess pipeline as one BLS script."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import pipeline_models as pm  # noqa: E402  (tests/ is on sys.path through the root conftest)
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from conftest import EXAMPLE_MODELS, FIXTURE_MODELS, wait_for  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.inferd_only

PIXELS = 32768
DIM = 16

CALLER = '''
import asyncio, json
import numpy as np
import triton_python_backend_utils as pb_utils


def call(target, inputs, outputs, **kw):
    return pb_utils.InferenceRequest(model_name=target, inputs=inputs, requested_output_names=outputs, **kw)


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    async def execute(self, requests):
        return [await self.one(r) for r in requests]

    async def one(self, request):
        p = json.loads(request.parameters() or "{}")
        mode = p.get("mode", "sync")
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        if mode in ("sync", "missing", "bad_input"):
            target = {"sync": "add_sub", "missing": "no_such_model", "bad_input": "add_sub"}[mode]
            name = "NOPE" if mode == "bad_input" else "INPUT0"
            resp = call(target, [pb_utils.Tensor(name, x), pb_utils.Tensor("INPUT1", x)],
                        ["OUTPUT0", "OUTPUT1"]).exec()
            if resp.has_error():
                return pb_utils.InferenceResponse(error=pb_utils.TritonError("callee: " + resp.error().message()))
            s = pb_utils.get_output_tensor_by_name(resp, "OUTPUT0").as_numpy()
            return pb_utils.InferenceResponse([pb_utils.Tensor("Y", s)])
        if mode == "async":  # several calls in flight at once
            resps = await asyncio.gather(*[
                call("add_sub", [pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x * k)],
                     ["OUTPUT0"]).async_exec() for k in range(1, 5)])
            total = sum(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy() for r in resps)
            return pb_utils.InferenceResponse([pb_utils.Tensor("Y", total.astype(np.float32))])
        if mode == "decoupled":
            n = int(x[0])
            got = []
            for resp in call("decoupled_repeat", [pb_utils.Tensor("IN", np.array([n], np.int32))],
                             ["OUT"]).exec(decoupled=True):
                if resp.has_error():
                    raise pb_utils.TritonModelException(resp.error().message())
                if resp.output_tensors():
                    got.append(float(pb_utils.get_output_tensor_by_name(resp, "OUT").as_numpy()[0]))
            y = np.zeros(16, np.float32)
            y[: len(got)] = got
            y[15] = len(got)
            return pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)])
        if mode == "reiterate":  # Triton's qa bls test_response_iterator: counts seen by each way of iterating
            n = int(x[0])
            replies = call("decoupled_repeat", [pb_utils.Tensor("IN", np.array([n], np.int32))],
                           ["OUT"]).exec(decoupled=True)
            counts = [1 if next(replies) is not None else 0, len(list(replies))]  # next(), then the rest
            counts += [len(list(replies)), len(list(replies))]  # finished: each `for` sees every response
            seen = 0
            for _ in replies:
                seen += 1
                if seen == 2:
                    break
            next(replies)
            counts += [len(list(replies))]  # the rest after a break and a next()
            try:
                next(replies)
                counts.append(-1)
            except StopIteration:
                counts.append(0)
            y = np.zeros(16, np.float32)
            y[: len(counts)] = counts
            return pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)])
        if mode == "timeout_value":  # a large timeout (11000 s in us) reaches the callee's request.timeout()
            request = call("timeout_probe", [pb_utils.Tensor("X", x)], ["Y"], timeout=11000000000)
            for resp in (request.exec(), next(request.exec(decoupled=True))):
                if resp.has_error():
                    raise pb_utils.TritonModelException(resp.error().message())
            return pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(resp, "Y")])
        if mode == "timeout":
            resp = call("sleep", [pb_utils.Tensor("INPUT0", np.array([3.0], np.float32))], ["OUTPUT0"],
                        timeout=200000).exec()
            msg = resp.error().message() if resp.has_error() else "no error"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("callee: " + msg))
        if mode == "self":
            resp = call(self.name, [pb_utils.Tensor("X", x)], ["Y"]).exec()
            msg = resp.error().message() if resp.has_error() else "no error"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("callee: " + msg))
        if mode == "large":  # 1 MiB each way, by handle
            big = np.arange(262144, dtype=np.float32) + x[0]
            resp = call("identity_fp32", [pb_utils.Tensor("INPUT0", big)], ["OUTPUT0"]).exec()
            out = pb_utils.get_output_tensor_by_name(resp, "OUTPUT0").as_numpy()
            ok = np.array_equal(out, big)
            return pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.full(16, float(ok) + out[-1], np.float32))])
        if mode == "control":
            before = pb_utils.is_model_ready("identity_fp32")
            pb_utils.unload_model("identity_fp32")
            after_unload = pb_utils.is_model_ready("identity_fp32")
            pb_utils.load_model("identity_fp32")
            after_load = pb_utils.is_model_ready("identity_fp32")
            y = np.array([before, after_unload, after_load] + [0] * 13, dtype=np.float32)
            return pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)])
        raise ValueError("unknown mode " + mode)
'''

TIMEOUT_PROBE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            pb_utils.Logger.log_info(f"Request timeout: {request.timeout()}")  # as Triton's qa model logs it
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.full(16, request.timeout() / 1e9,
                                                                                 np.float32))]))
        return out
'''

PIPELINE_BLS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def run(model, name, tensor, outputs):
    resp = pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor(name, tensor)],
                                     requested_output_names=outputs).exec()
    if resp.has_error():
        raise pb_utils.TritonModelException(resp.error().message())
    return resp


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            feats = pb_utils.get_output_tensor_by_name(run("pipeline_pre", "IMAGE", image, ["FEATURES"]), "FEATURES")
            emb = pb_utils.get_output_tensor_by_name(
                run("pipeline_embed", "FEATURES", feats.as_numpy(), ["EMBEDDING"]), "EMBEDDING")
            post = run("pipeline_post", "EMBEDDING", emb.as_numpy(), ["NORMALIZED", "LABEL"])
            out.append(pb_utils.InferenceResponse(post.output_tensors()))
        return out
'''


def _write(repo: Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(module_server_factory, tmp_path_factory):
    repo = pm.write_pipeline(tmp_path_factory.mktemp("blsrepo") / "models", PIXELS, DIM)
    for name in ("add_sub", "identity_fp32"):
        shutil.copytree(EXAMPLE_MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("sleep", "decoupled_repeat"):
        shutil.copytree(FIXTURE_MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    _write(repo, "bls_caller", CALLER, 'name: "bls_caller"\nbackend: "python"\n'
           'input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
           'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
           'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    _write(repo, "timeout_probe", TIMEOUT_PROBE, 'name: "timeout_probe"\nbackend: "python"\n'
           'input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
           'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
    _write(repo, "pipeline_bls", PIPELINE_BLS, f'name: "pipeline_bls"\nbackend: "python"\n'
           f'input [ {{ name: "IMAGE" data_type: TYPE_UINT8 dims: [ {PIXELS} ] }} ]\n'
           f'output [ {{ name: "NORMALIZED" data_type: TYPE_FP32 dims: [ {DIM} ] }}, '
           '{ name: "LABEL" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    names = ["pipeline", "pipeline_pre", "pipeline_embed", "pipeline_post", "add_sub", "identity_fp32", "sleep",
             "decoupled_repeat", "bls_caller", "pipeline_bls", "timeout_probe"]
    # --log-verbose=1 as Triton's qa bls suite runs (its timeout check greps the log)
    return module_server_factory(repo=repo, control_mode="explicit", load_models=names, wait_ready=names,
                                 extra_args=["--log-verbose=1"])


def _call(server, mode: str, x: np.ndarray | None = None) -> np.ndarray:
    client = server.http_client()
    x = np.arange(16, dtype=np.float32) if x is None else x
    inp = httpclient.InferInput("X", [16], "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("bls_caller", [inp], parameters={"mode": mode}).as_numpy("Y")


def _error(server, mode: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        _call(server, mode)
    return str(info.value)


def test_sync_exec(server):
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(_call(server, "sync", x), x + x)


def test_concurrent_async_exec(server):
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(_call(server, "async", x), sum(x + x * k for k in range(1, 5)))


def test_decoupled_iteration(server):
    y = _call(server, "decoupled", np.full(16, 5, dtype=np.float32))
    assert y[15] == 5
    np.testing.assert_array_equal(y[:5], [0, 1, 2, 3, 4])
    y = _call(server, "decoupled", np.zeros(16, dtype=np.float32))  # only a flag-only FINAL
    assert y[15] == 0


def test_a_finished_response_iterator_iterates_again(server):
    """4 responses then a flag-only final: 5 in all; iterated again, python_backend's iterator yields
    them all again; after a break and a next(), the rest; exhausted, next() raises StopIteration."""
    y = _call(server, "reiterate", np.full(16, 4, dtype=np.float32))
    assert y[:6].tolist() == [1, 4, 5, 5, 2, 0]


def test_callee_errors_reach_the_caller(server):
    # python_backend's wording for a callee that is unknown or not ready (Triton's qa bls test_bls_sync)
    assert "Failed for execute the inference request. Model 'no_such_model' is not ready." in _error(server, "missing")
    assert "missing required input(s) ['INPUT0']" in _error(server, "bad_input")
    np.testing.assert_array_equal(_call(server, "sync"), np.arange(16, dtype=np.float32) * 2)  # still serving


def test_a_large_bls_timeout_reaches_the_callee(server):
    """Triton's qa bls test_timeout: timeout=11000000000 us is the callee's request.timeout(), which its
    log line shows (the suite greps the server log for "Request timeout: 11000000000")."""
    assert _call(server, "timeout_value")[0] == pytest.approx(11.0)
    wait_for(lambda: "Request timeout: 11000000000" in server.log(), 30, "the callee's log line")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_timeout_reaches_the_model(server, protocol):
    """The request's timeout (tritonclient's `timeout`, in us) is the model's request.timeout()."""
    mod = httpclient if protocol == "http" else grpcclient
    client = server.http_client() if protocol == "http" else server.grpc_client()
    inp = mod.InferInput("X", [16], "FP32")
    inp.set_data_from_numpy(np.zeros(16, np.float32))
    y = client.infer("timeout_probe", [inp], timeout=7000000000).as_numpy("Y")
    assert y[0] == pytest.approx(7.0)
    wait_for(lambda: "Request timeout: 7000000000" in server.log(), 30, "the model's log line")
    client.close()


def test_timeout_is_enforced(server):
    assert "callee: Request timeout expired" in _error(server, "timeout")


def test_self_call_with_no_free_instance_fails_instead_of_hanging(server):
    msg = _error(server, "self")
    assert "would deadlock" in msg and "bls_caller" in msg


def test_large_tensors_by_handle_and_no_leak(server):
    for i in range(20):
        y = _call(server, "large", np.full(16, float(i), dtype=np.float32))
        assert y[0] == 1.0 + 262143 + i  # equal round trip, last element

    def in_use() -> float:
        lines = [line for line in server.metrics().splitlines() if line.startswith("inferd_shm_bytes_in_use")]
        assert lines, "inferd_shm_bytes_in_use is not exported"
        return float(lines[0].rsplit(" ", 1)[1])

    # the caller's arrays die with its execute; the release reaches the supervisor just after the reply
    server.wait_until(lambda: in_use() == 0, 30, "BLS output leases released")


def test_model_control_from_a_model(server):
    y = _call(server, "control")
    assert list(y[:3]) == [1.0, 0.0, 1.0]
    assert server.model_ready("identity_fp32")


def test_pipeline_as_one_bls_model_equals_the_ensemble(server):
    client = server.http_client()
    image = np.random.default_rng(4).integers(0, 256, PIXELS, dtype=np.uint8)
    inp = httpclient.InferInput("IMAGE", [PIXELS], "UINT8")
    inp.set_data_from_numpy(image, binary_data=True)
    via_bls = client.infer("pipeline_bls", [inp])
    via_ensemble = client.infer("pipeline", [inp])
    norm, label = pm.reference(image, PIXELS, DIM)
    np.testing.assert_array_equal(via_bls.as_numpy("NORMALIZED"), via_ensemble.as_numpy("NORMALIZED"))
    np.testing.assert_array_equal(via_bls.as_numpy("LABEL"), via_ensemble.as_numpy("LABEL"))
    np.testing.assert_allclose(via_bls.as_numpy("NORMALIZED"), norm, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(via_bls.as_numpy("LABEL"), label)
