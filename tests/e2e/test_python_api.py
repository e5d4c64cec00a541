"""The Python API (inferd.pytriton, issue 27) end to end: functions bound in this process, served by a
child `inferd` server, called with unmodified tritonclient (HTTP, gRPC) and with the bundled clients."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from inferd.pytriton.client import AsyncioModelClient, DecoupledModelClient, FuturesModelClient, ModelClient
from inferd.pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
)
from inferd.pytriton.decorators import (
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from inferd.pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError
from inferd.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from inferd.pytriton.triton import Triton, TritonConfig

pytestmark = pytest.mark.inferd_only

from tests.conftest import EXAMPLE_MODELS, free_ports, pid_alive, wait_for  # noqa: E402

F32 = np.float32
BATCHES: list[int] = []  # batch sizes the batched model saw
INSTANCES: set[str] = set()


@batch
def add_sub(INPUT0, INPUT1):
    BATCHES.append(len(INPUT0))
    INSTANCES.add(threading.current_thread().name)
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def counter(requests):
    """Decoupled: N responses per request, then the final flag."""
    n = int(requests[0]["N"][0])
    for i in range(n):
        yield [{"OUT": np.array([i], np.int64)}]


@sample
def upper(TEXT):
    return {"OUT": np.char.upper(TEXT.astype(np.bytes_))}


@batch
def wrong_dtype(X):
    return {"Y": X.astype(np.float64)}


SLOW = threading.Event()


@batch
def slow(X):
    SLOW.wait(30)  # released by the test once the client has timed out
    return {"Y": X}


def tag_length(requests):
    """Request parameters reach the function (PyTriton's Request.parameters)."""
    return [{"Y": np.full((len(r["X"]), 2), len(str(r.parameters.get("tag", ""))), F32)} for r in requests]


@batch
def failing(X):
    raise ValueError("the model refuses %d rows" % len(X))


@fill_optionals(B=np.array([10.0], F32))
@group_by_keys
@batch
@first_value("SCALE")
@triton_context
def decorated(A, B, SCALE, triton_context):
    assert triton_context.model_config.max_batch_size == 8
    return {"OUT": (A + B) * F32(SCALE)}


@batch
@group_by_values("MODE")
def by_mode(X, MODE):
    return {"OUT": X * (2 if MODE[0, 0] == 1 else 3)}


@pad_batch
def padded(X):
    return {"OUT": np.full_like(X, len(X))}


def tensors(*specs):
    return [Tensor(name=n, dtype=d, shape=s) for n, d, s in specs]


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    http, grpc, metrics = free_ports(3)
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(EXAMPLE_MODELS / "add_sub", repo / "repo_add_sub")
    config = repo / "repo_add_sub" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_sub"', 'name: "repo_add_sub"'))
    t = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, model_repository=repo))
    t.bind("add_sub", [add_sub, add_sub], tensors(("INPUT0", F32, (4,)), ("INPUT1", F32, (4,))),
           tensors(("OUTPUT0", F32, (4,)), ("OUTPUT1", F32, (4,))),
           config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)))
    t.bind("counter", counter, tensors(("N", np.int64, (1,))), tensors(("OUT", np.int64, (1,))),
           config=ModelConfig(batching=False, decoupled=True))
    t.bind("upper", upper, tensors(("TEXT", np.bytes_, (-1,))), tensors(("OUT", np.bytes_, (-1,))),
           config=ModelConfig(batching=False))
    t.bind("strict", wrong_dtype, tensors(("X", F32, (2,))), tensors(("Y", F32, (2,))), strict=True)
    t.bind("lenient", wrong_dtype, tensors(("X", F32, (2,))), tensors(("Y", F32, (2,))))
    t.bind("tag_length", tag_length, tensors(("X", F32, (2,))), tensors(("Y", F32, (2,))))
    t.bind("slow", slow, tensors(("X", F32, (2,))), tensors(("Y", F32, (2,))))
    t.bind("failing", failing, tensors(("X", F32, (2,))), tensors(("Y", F32, (2,))))
    t.bind("decorated", decorated, [Tensor(name="A", dtype=F32, shape=(2,)),
                                    Tensor(name="B", dtype=F32, shape=(2,), optional=True),
                                    Tensor(name="SCALE", dtype=F32, shape=(1,))],
           tensors(("OUT", F32, (2,))), config=ModelConfig(max_batch_size=8))
    t.run()
    yield t
    SLOW.set()
    t.stop()


def http_url(t):
    return "http://127.0.0.1:%d" % t._config.http_port


def grpc_url(t):
    return "grpc://127.0.0.1:%d" % t._config.grpc_port


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_calls_a_bound_function(triton, protocol):
    lib = httpclient if protocol == "http" else grpcclient
    port = triton._config.http_port if protocol == "http" else triton._config.grpc_port
    client = lib.InferenceServerClient("127.0.0.1:%d" % port)
    a, b = np.arange(8, dtype=F32).reshape(2, 4), np.ones((2, 4), F32)
    inputs = [lib.InferInput("INPUT0", [2, 4], "FP32"), lib.InferInput("INPUT1", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    client.close()


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_model_client_sample_batch_and_config(triton, scheme):
    url = http_url(triton) if scheme == "http" else grpc_url(triton)
    with ModelClient(url, "add_sub") as client:
        out = client.infer_sample(np.ones(4, F32), np.full(4, 2, F32))
        np.testing.assert_array_equal(out["OUTPUT0"], np.full(4, 3, F32))
        out = client.infer_batch(INPUT0=np.ones((3, 4), F32), INPUT1=np.ones((3, 4), F32))
        assert out["OUTPUT1"].shape == (3, 4)
        config = client.model_config
        assert config.max_batch_size == 16 and config.batching
        assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"] and config.inputs[0].dtype == F32
    with ModelClient(url, "upper") as client:
        assert client.infer_sample(TEXT=np.array([b"ab", b"c"]))["OUT"].tolist() == [b"AB", b"C"]
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(TEXT=np.array([b"x"]))


def test_dynamic_batching_and_two_instances(triton):
    BATCHES.clear()
    with FuturesModelClient(http_url(triton), "add_sub", max_workers=12) as client:
        futures = [client.infer_sample(np.full(4, i, F32), np.ones(4, F32)) for i in range(48)]
        for i, f in enumerate(futures):
            np.testing.assert_array_equal(f.result(timeout=60)["OUTPUT1"], np.full(4, i - 1, F32))
    assert sum(BATCHES) == 48 and max(BATCHES) > 1  # the server batched requests together
    assert len(INSTANCES) == 2  # both callables of the list served (one thread each)


def test_decoupled_generator_streams(triton):
    with DecoupledModelClient(grpc_url(triton), "counter") as client:
        assert [int(r["OUT"][0]) for r in client.infer_sample(np.array([4], np.int64))] == [0, 1, 2, 3]
        assert list(client.infer_sample(np.array([0], np.int64))) == []


def test_asyncio_decoupled_client_streams(triton):
    from inferd.pytriton.client import AsyncioDecoupledModelClient

    async def run():
        async with AsyncioDecoupledModelClient(grpc_url(triton), "counter") as client:
            return [int(r["OUT"][0]) async for r in client.infer_sample(np.array([3], np.int64))]

    assert asyncio.run(run()) == [0, 1, 2]


def test_asyncio_client(triton):
    async def run():
        async with AsyncioModelClient(http_url(triton), "add_sub") as client:
            outs = await asyncio.gather(*(client.infer_sample(np.full(4, i, F32), np.ones(4, F32)) for i in range(8)))
            return [float(o["OUTPUT0"][0]) for o in outs]

    assert asyncio.run(run()) == [i + 1.0 for i in range(8)]


def test_strict_output_check_and_lenient_conversion(triton):
    with ModelClient(http_url(triton), "strict") as client, pytest.raises(
            PyTritonClientInferenceServerError, match="dtype float64, expected float32"):
        client.infer_sample(X=np.ones(2, F32))
    with ModelClient(http_url(triton), "lenient") as client:
        out = client.infer_sample(X=np.ones(2, F32))
        assert out["Y"].dtype == F32


def test_exception_in_the_function_reaches_the_client(triton):
    with ModelClient(grpc_url(triton), "failing") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="the model refuses 1 rows"):
            client.infer_sample(X=np.ones(2, F32))
        np.testing.assert_array_equal(  # the instance is still serving
            ModelClient(grpc_url(triton), "add_sub").infer_sample(np.ones(4, F32), np.ones(4, F32))["OUTPUT0"],
            np.full(4, 2, F32))


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_inference_timeout_is_pytriton_timeout_error(triton, scheme):
    url = http_url(triton) if scheme == "http" else grpc_url(triton)
    with ModelClient(url, "slow", inference_timeout_s=0.5) as client, pytest.raises(PyTritonClientTimeoutError):
        client.infer_sample(X=np.ones(2, F32))


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_request_parameters_reach_the_function(triton, scheme):
    url = http_url(triton) if scheme == "http" else grpc_url(triton)
    with ModelClient(url, "tag_length") as client:
        assert client.infer_sample(X=np.ones(2, F32), parameters={"tag": "abcd"})["Y"][0] == 4


def test_decorators_fill_optionals_first_value_context(triton):
    with ModelClient(http_url(triton), "decorated") as client:
        out = client.infer_sample(A=np.array([1, 2], F32), SCALE=np.array([2], F32))
        np.testing.assert_array_equal(out["OUT"], [22, 24])  # B filled with 10
        out = client.infer_sample(A=np.array([1, 2], F32), B=np.array([1, 1], F32), SCALE=np.array([3], F32))
        np.testing.assert_array_equal(out["OUT"], [6, 9])


def test_group_by_values_and_pad_batch_in_process():
    from inferd.pytriton import backend
    from inferd.pytriton.model_spec import BoundModel
    from inferd.pytriton.proxy.types import Request

    reqs = [Request({"X": np.ones((1, 2), F32), "MODE": np.array([[m]], np.int64)}) for m in (1, 2, 1)]
    outs = by_mode(reqs)
    assert [o["OUT"][0, 0] for o in outs] == [2, 3, 2]
    backend._current.model = BoundModel.create(
        "p", padded, tensors(("X", F32, (1,))), tensors(("OUT", F32, (1,))),
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[4])), False)
    assert padded(X=np.ones((3, 1), F32))["OUT"].shape == (4, 1)  # up to the preferred size 4
    assert padded(X=np.ones((5, 1), F32))["OUT"].shape == (8, 1)  # then the max batch size
    backend._current.model = None


def test_repository_models_beside_bound_functions(triton):
    with ModelClient(http_url(triton), "repo_add_sub") as client:
        out = client.infer_sample(INPUT0=np.ones(16, F32), INPUT1=np.ones(16, F32))
        np.testing.assert_array_equal(out["OUTPUT0"], np.full(16, 2, F32))


def test_bind_while_running_and_unknown_model(triton):
    triton.bind("late", sample(lambda X: {"Y": X * 2}), tensors(("X", F32, (1,))), tensors(("Y", F32, (1,))),
                config=ModelConfig(batching=False))
    with ModelClient(http_url(triton), "late") as client:
        assert client.infer_sample(X=np.array([4], F32))["Y"][0] == 8
    with pytest.raises(PyTritonInvalidOperationError):
        triton.bind("late", lambda r: r, [], [])
    bad = ModelConfig(max_batch_size=4, batcher=DynamicBatcher(preferred_batch_size=[100]))
    with pytest.raises(PyTritonBadParameterError, match="preferred"):
        triton.bind("broken", batch(lambda X: {"Y": X}), tensors(("X", F32, (1,))), tensors(("Y", F32, (1,))),
                    config=bad)
    triton.bind("broken", batch(lambda X: {"Y": X}), tensors(("X", F32, (1,))), tensors(("Y", F32, (1,))))
    with pytest.raises((PyTritonClientTimeoutError, PyTritonClientModelUnavailableError)):
        ModelClient(http_url(triton), "nope", init_timeout_s=0.5).infer_sample(X=np.ones(1, F32))


def test_metrics_and_statistics_count_bound_models(triton):
    import urllib.request

    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % triton._config.metrics_port, timeout=10).read()
    assert b'nv_inference_request_success{model="add_sub",version="1"}' in body


def test_context_manager_stops_everything(tmp_path):
    http, grpc, metrics = free_ports(3)
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics),
                workspace=tmp_path / "ws") as t:
        t.bind("echo", sample(lambda X: {"Y": X}), tensors(("X", F32, (1,))), tensors(("Y", F32, (1,))),
               config=ModelConfig(batching=False))
        pid = t._proc.pid
        assert t.is_alive()
        with ModelClient("127.0.0.1:%d" % http, "echo") as client:
            assert client.infer_sample(X=np.array([5], F32))["Y"][0] == 5
    assert not t.is_alive()
    wait_for(lambda: not pid_alive(pid), 30, "the server to exit")
    assert not t.stop()  # a second stop does nothing
    assert os.path.isdir(tmp_path / "ws")  # a given workspace is the user's: kept


def test_grpc_only_server_binds_while_running_and_unloads(tmp_path):
    """allow_http=False: start-up and loads go without HTTP (the host link, then gRPC)."""
    _, grpc, metrics = free_ports(3)
    with Triton(config=TritonConfig(allow_http=False, grpc_port=grpc, metrics_port=metrics)) as t:
        t.bind("echo", sample(lambda X: {"Y": X}), tensors(("X", F32, (1,))), tensors(("Y", F32, (1,))),
               config=ModelConfig(batching=False))
        with ModelClient("grpc://127.0.0.1:%d" % grpc, "echo") as client:
            assert client.infer_sample(X=np.array([7], F32))["Y"][0] == 7
            client.unload_model()
            with pytest.raises(PyTritonClientModelUnavailableError):
                client.infer_sample(X=np.array([7], F32))
            client.load_model()
            assert client.infer_sample(X=np.array([8], F32))["Y"][0] == 8


def test_examples_directory_still_serves_as_a_repository():
    """examples/python_api holds scripts: `make run` (the whole examples/ repository, control mode none)
    must still start and serve every example model."""
    import subprocess
    import sys
    import urllib.request

    assert (Path(EXAMPLE_MODELS) / "python_api" / "add_sub.py").is_file()
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "inferd.supervisor", "--model-repository", str(EXAMPLE_MODELS),
                             "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)])
    try:
        def ready():
            assert proc.poll() is None, "the server exited"
            try:
                return urllib.request.urlopen("http://127.0.0.1:%d/v2/health/ready" % http, timeout=2).status == 200
            except OSError:
                return False

        wait_for(ready, 90, "examples/ to be served")
        req = urllib.request.Request("http://127.0.0.1:%d/v2/repository/index" % http, data=b"{}", method="POST")
        names = {m["name"] for m in json.loads(urllib.request.urlopen(req, timeout=10).read())}
        assert "python_api" not in names and "add_sub" in names
    finally:
        proc.terminate()
        proc.wait(timeout=60)
