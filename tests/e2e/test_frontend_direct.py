"""The direct path (issue 42): with --frontend-processes 2, requests of default-scheduled models go from the
frontend processes straight to the workers. Real server, unmodified tritonclient. The proof that a request
did not pass through the core: it is answered while the core process is stopped (SIGSTOP). Checks: HTTP and
gRPC, large inputs and outputs by region, statistics / metrics / status count direct requests at once, a
killed worker fails only what it held and the restarted one is used directly again, an unload waits for a
direct request in flight, and --frontend-direct false keeps every request on the core's path."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import target_is_triton
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.skipif(target_is_triton(), reason="inferd's --frontend-processes")

MODELS = ["add_sub", "big_identity", "sleep"]
WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS, control_mode="explicit", load_models=MODELS,
                                 inferd_args=["--frontend-processes", "2"])


def add_sub_inputs(mod, a: np.ndarray, b: np.ndarray) -> list:
    ins = [mod.InferInput("INPUT0", list(a.shape), "FP32"), mod.InferInput("INPUT1", list(b.shape), "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins


@contextlib.contextmanager
def core_stopped(server) -> Iterator[None]:
    """The core process stopped: only what bypasses it is answered meanwhile."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def wait_direct(server, model: str, inputs_of, output: str) -> None:
    """Until a request to `model` is answered with the core stopped: the workers have connected to both
    frontends (the core tells them to as they become ready). Each try is bounded by the client's timeout."""

    def answered_directly() -> bool:
        with core_stopped(server):
            for _ in range(8):  # new connections: the kernel spreads them over both frontends (2^-8: all on one)
                with httpclient.InferenceServerClient(server.http_url, network_timeout=1.0,
                                                      connection_timeout=1.0) as client:
                    try:
                        client.infer(model, inputs_of(httpclient), timeout=1)
                    except Exception:  # noqa: BLE001 - not direct yet: waits on the stopped core
                        return False
        return True

    server.wait_until(answered_directly, WAIT_S, f"requests to {model} answered without the core")


def test_http_and_grpc_requests_bypass_the_core(server):
    a, b = np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, b), "OUTPUT0")
    with core_stopped(server):
        with httpclient.InferenceServerClient(server.http_url, network_timeout=10.0) as client:
            for _ in range(20):
                result = client.infer("add_sub", add_sub_inputs(httpclient, a, b))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            for _ in range(20):
                result = client.infer("add_sub", add_sub_inputs(grpcclient, a, b), client_timeout=10.0)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                assert result.get_response().model_version == "1"


def test_large_tensors_go_by_region_both_ways(server):
    data = np.random.default_rng(7).integers(0, 255, 3 << 20, dtype=np.uint8)

    def inputs(mod):
        inp = mod.InferInput("IN", [data.size], "UINT8")
        inp.set_data_from_numpy(data)
        return [inp]

    wait_direct(server, "big_identity", inputs, "OUT")
    with core_stopped(server), httpclient.InferenceServerClient(server.http_url, network_timeout=20.0) as client:
        for _ in range(5):  # the worker gets its output regions back (ReleaseOutputs from the frontend)
            result = client.infer("big_identity", inputs(httpclient),
                                  outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])
            np.testing.assert_array_equal(result.as_numpy("OUT"), data)


def success_count(client, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"]
    return int(stats[0]["inference_stats"]["success"]["count"]) if stats else 0


def test_statistics_and_metrics_count_direct_requests_at_once(server):
    a = np.ones(16, dtype=np.float32)
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, a), "OUTPUT0")
    with httpclient.InferenceServerClient(server.http_url) as client:
        before = success_count(client, "add_sub")
        for _ in range(6):  # new connections each: both frontends take some
            with httpclient.InferenceServerClient(server.http_url) as one:
                one.infer("add_sub", add_sub_inputs(httpclient, a, a))
        with grpcclient.InferenceServerClient(server.grpc_url) as g:
            g.infer("add_sub", add_sub_inputs(grpcclient, a, a))
        assert success_count(client, "add_sub") == before + 7  # no wait: the core pulls the frontends first
        stats = client.get_inference_statistics("add_sub")["model_stats"][0]
        assert int(stats["inference_stats"]["compute_infer"]["count"]) >= before + 7
        assert int(stats["execution_count"]) >= before + 7
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=WAIT_S).read().decode()
    line = next(ln for ln in text.splitlines()
                if ln.startswith("nv_inference_request_success{") and 'model="add_sub"' in ln)
    assert int(float(line.rsplit(" ", 1)[1])) == before + 7


def test_status_shows_a_direct_request_in_flight_and_unload_waits_for_it(server):
    def sleep_inputs(mod, seconds: float = 0.0):
        inp = mod.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([seconds], dtype=np.float32))
        return [inp]

    wait_direct(server, "sleep", sleep_inputs, "OUTPUT0")
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [2.0]}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/sleep/infer", body)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # (a plain client: tritonclient.http is not thread-safe)
        running = pool.submit(lambda: json.loads(urllib.request.urlopen(request, timeout=WAIT_S).read()))
        server.wait_until(lambda: any(i.get("inflight") for i in server.instances("sleep")), WAIT_S,
                          "the direct request counted in flight in the status view")
        with httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S) as control:
            control.unload_model("sleep")  # answered once drained: the request in flight was answered first
            assert running.done()
            assert running.result()["outputs"][0]["data"] == [2.0]
            assert not control.is_model_ready("sleep")
            control.load_model("sleep")
            assert control.is_model_ready("sleep")


def test_a_killed_worker_fails_what_it_held_and_its_replacement_is_used_directly(server):
    a = np.ones(16, dtype=np.float32)
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, a), "OUTPUT0")
    (victim,) = server.worker_pids("add_sub")
    os.kill(victim, signal.SIGKILL)
    server.wait_until(lambda: (p := server.worker_pids("add_sub")) and victim not in p and p, WAIT_S,
                      "add_sub's worker restarted")
    server.wait_until(lambda: all(i.get("state") == "ready" for i in server.instances("add_sub")), WAIT_S,
                      "add_sub ready again")
    with httpclient.InferenceServerClient(server.http_url) as client:  # through the core or direct: answered
        result = client.infer("add_sub", add_sub_inputs(httpclient, a, a))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, a), "OUTPUT0")


def test_bad_input_is_refused_as_by_the_core(server):
    a = np.ones(16, dtype=np.float32)
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, a), "OUTPUT0")
    with httpclient.InferenceServerClient(server.http_url) as client:
        bad = [httpclient.InferInput("INPUT0", [16], "FP32")]
        bad[0].set_data_from_numpy(a)
        with pytest.raises(InferenceServerException, match="INPUT1"):
            client.infer("add_sub", bad)


def test_frontend_direct_false_keeps_requests_on_the_core(server_factory):
    srv = server_factory(["add_sub"], control_mode="explicit", load_models=["add_sub"],
                         inferd_args=["--frontend-processes", "2", "--frontend-direct", "false"])
    a = np.ones(16, dtype=np.float32)
    with httpclient.InferenceServerClient(srv.http_url) as client:
        client.infer("add_sub", add_sub_inputs(httpclient, a, a))
    with core_stopped(srv), httpclient.InferenceServerClient(srv.http_url, network_timeout=1.0,
                                                             connection_timeout=1.0) as client, \
            pytest.raises(Exception):  # noqa: B017,PT011 - a timeout of whichever kind the client raises
        client.infer("add_sub", add_sub_inputs(httpclient, a, a), timeout=1)


def test_a_worker_dying_under_a_direct_request_fails_it_with_the_cores_cause(server):
    wait_direct(server, "sleep", lambda mod: [_seconds(mod, 0.0)], "OUTPUT0")
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [20.0]}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/sleep/infer", body)

    def call() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=WAIT_S) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(call)
        busy = server.wait_until(lambda: [i for i in server.instances("sleep") if i.get("inflight")], WAIT_S,
                                 "the direct request running in a worker")
        os.kill(busy[0]["pid"], signal.SIGKILL)
        status, text = running.result(timeout=WAIT_S)
    assert status == 503, text
    assert f"instance '{busy[0]['name']}'" in text and "died" in text and "killed by signal 9" in text, text


def _seconds(mod, value: float):
    inp = mod.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.array([value], dtype=np.float32))
    return inp


def test_a_restarted_frontend_gets_the_workers_connections_again(server):
    a = np.ones(16, dtype=np.float32)
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, a), "OUTPUT0")
    frontends = [p.pid for p in psutil.Process(server.pid).children()
                 if "frontend_processes.frontend_main" in " ".join(p.cmdline())]
    assert len(frontends) == 2
    os.kill(frontends[0], signal.SIGKILL)

    def replaced() -> bool:
        now = [p.pid for p in psutil.Process(server.pid).children()
               if "frontend_processes.frontend_main" in " ".join(p.cmdline())]
        return len(now) == 2 and frontends[0] not in now

    server.wait_until(replaced, WAIT_S, "the killed frontend process replaced")
    # answered with the core stopped through either frontend: the workers connected to the new one too
    wait_direct(server, "add_sub", lambda mod: add_sub_inputs(mod, a, a), "OUTPUT0")
