"""Dynamic batcher end to end (unmodified tritonclient): batch_probe models report what each execute()
saw, so the tests check batch sizes, preferred sizes, the queue delay, shape separation and answer order
from the model's side. Runs against Triton too (INFERD_E2E_TARGET=triton), except the ONNX test."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from conftest import target_is_triton
from tritonclient.grpc import InferInput

MODELS = ["batch_probe", "batch_probe_delay", "batch_probe_preferred", "batch_probe_ordered",
          "batch_probe_unordered"]
WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


def probe_input(rows: int = 1, cols: int = 2, value: float = 0.0) -> list[InferInput]:
    data = (np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + value)
    inp = InferInput("INPUT0", [rows, cols], "FP32")
    inp.set_data_from_numpy(data)
    return [inp]


def col(result: Any, name: str) -> int:
    return int(result.as_numpy(name)[0, 0])


async def infer_all(server, model: str, inputs: list[list[InferInput]],
                    parameters: list[dict] | None = None) -> list[Any]:
    """Send every request at once over one gRPC channel; answers in request order."""
    async with grpcaio.InferenceServerClient(server.grpc_url) as client:
        return await asyncio.gather(*(
            client.infer(model, inp, parameters=(parameters[i] if parameters else None), client_timeout=WAIT_S)
            for i, inp in enumerate(inputs)))


def counts(server, model: str) -> tuple[int, int]:
    stats = server.http_client().get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_concurrent_requests_are_batched(server):
    inference0, execution0 = counts(server, "batch_probe")
    inputs = [probe_input(value=100 * i) for i in range(16)]
    results = asyncio.run(infer_all(server, "batch_probe", inputs))
    for i, result in enumerate(results):  # each request gets its own rows back
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"),
                                      np.arange(2, dtype=np.float32).reshape(1, 2) + 100 * i)
    sizes = [col(r, "BATCH_REQUESTS") for r in results]
    assert max(sizes) > 1, sizes
    assert all(1 <= s <= 16 for s in sizes)
    executions = {col(r, "EXECUTION") for r in results}
    inference, execution = counts(server, "batch_probe")
    assert inference - inference0 == 16
    assert execution - execution0 == len(executions) < 16


async def _labelled(server, count: int) -> list[Any]:
    async with grpcaio.InferenceServerClient(server.grpc_url) as client:
        return await asyncio.gather(*(client.infer("batch_probe", probe_input(value=i), request_id=f"r{i}",
                                                   client_timeout=WAIT_S) for i in range(count)))


def test_batched_responses_carry_model_version_and_their_own_id(server):
    # the worker labels each response (no labelling callback in the data plane for this scheduler)
    for i, result in enumerate(asyncio.run(_labelled(server, 12))):
        response = result.get_response()
        assert (response.model_name, response.model_version, response.id) == ("batch_probe", "1", f"r{i}")


def test_multi_row_requests_never_pass_max_batch_size(server):
    inference0, _ = counts(server, "batch_probe")
    results = asyncio.run(infer_all(server, "batch_probe", [probe_input(rows=3, value=i) for i in range(10)]))
    for i, result in enumerate(results):
        assert result.as_numpy("OUTPUT0").shape == (3, 2)
        assert result.as_numpy("BATCH_ITEMS").shape == (3, 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[:, 0], np.arange(0, 6, 2) + i)
    items = [col(r, "BATCH_ITEMS") for r in results]
    assert all(i <= 16 for i in items) and max(items) > 3, items
    assert counts(server, "batch_probe")[0] - inference0 == 30  # inference_count counts batch items


def test_mixed_shapes_never_share_a_batch(server):
    # shapes change every 4 requests: a batch ends where the shape changes (as in Triton), so requests
    # arriving in the order sent must still meet same-shape neighbours (alternating shapes never would)
    cols = [2 + i // 4 % 2 for i in range(16)]
    inputs = [probe_input(cols=cols[i], value=i) for i in range(16)]
    results = asyncio.run(infer_all(server, "batch_probe", inputs))
    assert all(col(r, "SHAPES") == 1 for r in results)
    assert max(col(r, "BATCH_REQUESTS") for r in results) > 1  # batching did happen
    for i, result in enumerate(results):
        assert result.as_numpy("OUTPUT0").shape == (1, cols[i])


def test_preferred_batch_size_is_sent_without_waiting_for_the_delay(server):
    start = time.monotonic()
    results = asyncio.run(infer_all(server, "batch_probe_preferred", [probe_input() for _ in range(8)]))
    sizes = [col(r, "BATCH_REQUESTS") for r in results]
    if target_is_triton():
        # Triton may still add requests to a formed batch that waits for its instance (5 + 3 seen;
        # the 3 then wait out the delay)
        assert sum(1 / s for s in sizes) == pytest.approx(2), sizes
    else:
        assert sizes == [4] * 8
        assert time.monotonic() - start < 4.5  # the 5 s queue delay never ran out


def test_lone_request_waits_for_the_queue_delay_then_goes(server):
    delay_s = 0.3
    start = time.monotonic()
    (result,) = asyncio.run(infer_all(server, "batch_probe_delay", [probe_input()]))
    elapsed = time.monotonic() - start
    assert col(result, "BATCH_REQUESTS") == 1
    assert delay_s * 0.95 <= elapsed < delay_s + 2.0, elapsed


def test_requests_within_the_delay_share_a_batch(server):
    results = asyncio.run(infer_all(server, "batch_probe_delay", [probe_input(), probe_input()]))
    assert [col(r, "BATCH_REQUESTS") for r in results] == [2, 2]


async def _wait_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        await asyncio.sleep(0.01)


async def _completion_order(server, model: str, tmp: Path, grace_s: float) -> list[str]:
    """Request "first" blocks in one instance while "second" runs on the other; the order they come back.
    "first" is released once "second" is back, or `grace_s` after it started running."""
    release, started1, started2 = tmp / "release", tmp / "started1", tmp / "started2"
    order: list[str] = []
    async with grpcaio.InferenceServerClient(server.grpc_url) as client:
        def send(name: str, params: dict) -> asyncio.Task:
            task = asyncio.ensure_future(client.infer(model, probe_input(), parameters=params,
                                                      client_timeout=WAIT_S))
            task.add_done_callback(lambda _: order.append(name))
            return task

        first = send("first", {"wait_file": str(release), "started_file": str(started1)})
        await _wait_file(started1)
        second = send("second", {"started_file": str(started2)})
        await _wait_file(started2)
        await asyncio.wait({second}, timeout=grace_s)
        release.touch()
        await asyncio.gather(first, second)
    return order


def test_preserve_ordering_answers_in_request_order(server, tmp_path):
    # "second" would be back within the 2 s grace if nothing held it (see the control below)
    assert asyncio.run(_completion_order(server, "batch_probe_ordered", tmp_path, 2.0)) == ["first", "second"]


def test_without_preserve_ordering_a_fast_answer_overtakes(server, tmp_path):
    """The control for the test above: the same requests, answered as they finish."""
    assert asyncio.run(_completion_order(server, "batch_probe_unordered", tmp_path, WAIT_S)) == ["second", "first"]


@pytest.mark.inferd_only
def test_onnx_model_batched_under_concurrency_equals_one_by_one(server_factory, tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import framework_models as fm  # tests/ is on sys.path through the root conftest

    repo = tmp_path / "repo"
    path = fm.onnx_add_sub(repo, "onnx_batched", "FP32", batch=True, max_batch_size=8,
                           extra_config="dynamic_batching { max_queue_delay_microseconds: 50000 }\n")
    srv = server_factory(repo=repo, wait_ready=["onnx_batched"])
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(24)]

    def inputs(a: np.ndarray) -> list[InferInput]:
        out = []
        for name, value in (("INPUT0", a), ("INPUT1", a * 0.5)):
            inp = InferInput(name, list(value.shape), "FP32")
            inp.set_data_from_numpy(value)
            out.append(inp)
        return out

    results = asyncio.run(infer_all(srv, "onnx_batched", [inputs(a) for a in arrays]))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for a, result in zip(arrays, results):
        want = session.run(None, {"INPUT0": a, "INPUT1": a * 0.5})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), want[0])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), want[1])
    inference, execution = counts(srv, "onnx_batched")
    assert inference == sum(a.shape[0] for a in arrays)
    assert execution < len(arrays)
