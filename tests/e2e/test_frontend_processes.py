"""--frontend-processes 2: HTTP and gRPC served by two processes on the same ports (SO_REUSEPORT), the
supervisor (core) keeping the models. Unmodified tritonclient against a real server; a raw connection is
pinned to the frontend that accepted it (found from /proc through psutil) where a test needs to know
which process serves it. Checks: infer, metadata, model control, statistics and metrics count one
server, dynamic batches formed from requests of both frontends, client system shared memory from any
frontend, large inputs reach the worker by the frontend's region handle, a killed frontend is restarted
and its clients get errors, not hangs."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import target_is_triton
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.skipif(target_is_triton(), reason="inferd's --frontend-processes")

MODELS = ["add_sub", "batch_probe_delay", "batch_probe_fixed", "big_identity", "decoupled_repeat", "sleep"]
WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS, control_mode="explicit", load_models=MODELS,
                                 inferd_args=["--frontend-processes", "2", "--allow-client-shm", "true"])


def frontend_pids(server) -> list[int]:
    out = []
    for child in psutil.Process(server.pid).children():
        try:
            if "inferd.supervisor.frontend_processes.frontend_main" in " ".join(child.cmdline()):
                out.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(out)


def wait_frontends_serving(server, harness, n: int = 2) -> list[int]:
    """The frontend pids once `n` of them listen on the HTTP and gRPC ports."""

    def listening() -> list[int] | None:
        pids = frontend_pids(server)
        if len(pids) != n:
            return None
        for pid in pids:
            try:
                ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN}
            except psutil.NoSuchProcess:
                return None
            if not {server.http_port, server.grpc_port} <= ports:
                return None
        return pids

    return server.wait_until(listening, WAIT_S, f"{n} frontend processes listening")


def owner_of(server, sock: socket.socket) -> int:
    """The frontend process holding the server side of our connection `sock`."""
    local = sock.getsockname()[1]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for pid in frontend_pids(server):
            try:
                conns = psutil.Process(pid).net_connections("tcp")
            except psutil.NoSuchProcess:
                continue
            if any(c.raddr and c.raddr.port == local and c.laddr.port in (server.http_port, server.grpc_port)
                   for c in conns):
                return pid
        time.sleep(0.02)
    raise AssertionError("no frontend process holds our connection")


def one_per_frontend(server, harness) -> dict[int, http.client.HTTPConnection]:
    """An open HTTP connection to each of the two frontends (new connections until both are hit)."""
    pids = wait_frontends_serving(server, harness)
    conns: dict[int, http.client.HTTPConnection] = {}
    for _ in range(200):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=WAIT_S)
        conn.connect()
        assert conn.sock is not None
        pid = owner_of(server, conn.sock)
        if pid in conns:
            conn.close()
        else:
            conns[pid] = conn
        if len(conns) == len(pids):
            return conns
    raise AssertionError("the kernel never spread connections over both frontends")


def add_sub_body(a: list[float], b: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": a},
                                  {"name": "INPUT1", "datatype": "FP32", "shape": [16], "data": b}]}).encode()


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data else None


def http_inputs(a: np.ndarray, b: np.ndarray, module: Any = httpclient) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_two_processes_serve_infer_over_http_and_grpc(server, harness):
    wait_frontends_serving(server, harness)
    log = server.log()  # ready (and systemd's READY=1) only once both frontends listen
    ready = log.index("inferd ready")
    assert log.count("Started HTTPService") == 2 and log.count("Started GRPCInferenceService") == 2, log
    assert max(log.rindex("Started HTTPService"), log.rindex("Started GRPCInferenceService")) < ready
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    for _ in range(6):  # new clients: new connections, spread by the kernel
        with httpclient.InferenceServerClient(server.http_url) as client:
            result = client.infer("add_sub", http_inputs(a, b))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            result = client.infer("add_sub", http_inputs(a, b, grpcclient))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    for conn in one_per_frontend(server, harness).values():  # each frontend answers
        status, doc = post(conn, "/v2/models/add_sub/infer", add_sub_body([1.0] * 16, [2.0] * 16))
        assert status == 200, doc
        assert doc["outputs"][0]["data"] == [3.0] * 16
        conn.close()


def test_metadata_config_and_errors_match_one_process(server, harness):
    wait_frontends_serving(server, harness)
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.is_server_live() and client.is_server_ready()
        meta = client.get_model_metadata("add_sub")
        assert meta["name"] == "add_sub" and meta["versions"] == ["1"]
        assert client.get_model_config("add_sub")["max_batch_size"] == 0
        assert client.get_server_metadata()["name"] == "triton"
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
            client.get_model_metadata("nope")
        with pytest.raises(InferenceServerException, match="unexpected shape for input 'INPUT0'"):
            bad = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
            for t in bad:
                t.set_data_from_numpy(np.zeros(4, dtype=np.float32))
            client.infer("add_sub", bad)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_model_ready("add_sub")
        assert client.get_model_metadata("add_sub").name == "add_sub"
        assert client.get_model_config("add_sub").config.name == "add_sub"
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index["add_sub"] == "READY"


def test_statistics_and_metrics_count_both_frontends(server, harness):
    conns = one_per_frontend(server, harness)

    def count() -> int:
        with httpclient.InferenceServerClient(server.http_url) as client:
            return int(client.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"])

    before = count()
    for conn in conns.values():
        for _ in range(3):
            status, doc = post(conn, "/v2/models/add_sub/infer", add_sub_body([1.0] * 16, [1.0] * 16))
            assert status == 200, doc
    assert count() == before + 6  # from whichever frontend asks
    for conn in conns.values():  # each frontend gives the same statistics
        conn.request("GET", "/v2/models/add_sub/stats")
        resp = conn.getresponse()
        assert int(json.loads(resp.read())["model_stats"][0]["inference_count"]) == before + 6
        conn.close()
    metrics = server.metrics()
    line = [x for x in metrics.splitlines() if x.startswith("nv_inference_count{") and 'model="add_sub"' in x]
    assert line and float(line[0].rsplit(" ", 1)[1]) == before + 6


def test_dynamic_batch_takes_requests_from_both_frontends(server, harness):
    conns = list(one_per_frontend(server, harness).values())
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()

    def together() -> list[dict[str, Any]]:
        results: list[Any] = [None, None]

        def send(i: int) -> None:
            results[i] = post(conns[i], "/v2/models/batch_probe_delay/infer", body)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        outs = []
        for status, doc in results:
            assert status == 200, doc
            outs.append({o["name"]: o["data"] for o in doc["outputs"]})
        return outs

    # the model's queue delay is 300 ms and its input's dims are variable (requests must match to share a batch:
    # it stays on the core's path, one batcher): two requests sent together meet in one batch whatever process took
    # them (three tries: a host so loaded that two threads start 300 ms apart must not fail the test)
    for _ in range(3):
        outs = together()
        if outs[0]["EXECUTION"] == outs[1]["EXECUTION"]:  # one execute() saw both
            break
    assert outs[0]["EXECUTION"] == outs[1]["EXECUTION"], outs
    assert outs[0]["BATCH_REQUESTS"] == [2]
    for conn in conns:
        conn.close()


def test_batches_of_both_frontends_merge_in_a_busy_worker(server, harness, tmp_path):
    """A model any requests of which may share a batch goes straight to the worker (the direct path): each
    frontend forms batches of its own requests and the worker merges the batches that wait for it, so while
    the instance is busy, requests that came through both frontends run in one execute(), as with one
    batcher. (An idle worker runs the first batch that reaches it.)"""
    conns = list(one_per_frontend(server, harness).values())
    started, release = tmp_path / "started", tmp_path / "release"

    def body(params: dict[str, Any] | None = None) -> bytes:
        doc: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        if params:
            doc["parameters"] = params
        return json.dumps(doc).encode()

    blocker_conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=WAIT_S)
    results: list[Any] = [None, None, None]

    def send(i: int, conn: http.client.HTTPConnection, payload: bytes) -> None:
        results[i] = post(conn, "/v2/models/batch_probe_fixed/infer", payload)

    threads = [threading.Thread(target=send, args=(2, blocker_conn,
                                                   body({"started_file": str(started), "wait_file": str(release)})))]
    threads[0].start()
    server.wait_until(started.exists, WAIT_S, "the blocking request running in the worker")
    for i in range(2):
        threads.append(threading.Thread(target=send, args=(i, conns[i], body())))
        threads[-1].start()

    def inflight() -> float:
        return sum(float(x.rsplit(" ", 1)[1]) for x in server.metrics().splitlines()
                   if x.startswith("inferd_instance_inflight_requests{") and 'model="batch_probe_fixed"' in x)

    # both requests have left their frontends' batchers (after the 300 ms delay) and wait at the worker
    server.wait_until(lambda: inflight() >= 3, WAIT_S, "both requests sent to the busy worker")
    release.touch()
    for t in threads:
        t.join(WAIT_S)
    outs = []
    for status, doc in results:
        assert status == 200, doc
        outs.append({o["name"]: o["data"] for o in doc["outputs"]})
    assert outs[0]["EXECUTION"] == outs[1]["EXECUTION"] != outs[2]["EXECUTION"], outs
    assert outs[0]["BATCH_REQUESTS"] == [2]
    for conn in (*conns, blocker_conn):
        conn.close()


def test_model_control_is_seen_by_every_frontend_at_once(server, harness):
    conns = one_per_frontend(server, harness)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.unload_model("add_sub")
        for conn in conns.values():  # no frontend serves the state from before the unload
            conn.request("GET", "/v2/models/add_sub/ready")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 400
        client.load_model("add_sub")
        for conn in conns.values():
            status, doc = post(conn, "/v2/models/add_sub/infer", add_sub_body([1.0] * 16, [1.0] * 16))
            assert status == 200, doc
            conn.close()


def test_system_shared_memory_registered_once_works_on_every_frontend(server, harness):
    conns = one_per_frontend(server, harness)
    key = "/inferd_test_scaleout_%d" % os.getpid()
    handle = shm.create_shared_memory_region("so_in", key, 256)
    try:
        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)])
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.register_system_shared_memory("so_in", key, 256)
            try:
                assert [r["name"] for r in client.get_system_shared_memory_status()] == ["so_in"]
                body = json.dumps({"inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [16],
                     "parameters": {"shared_memory_region": "so_in", "shared_memory_byte_size": 64}},
                    {"name": "INPUT1", "datatype": "FP32", "shape": [16],
                     "parameters": {"shared_memory_region": "so_in", "shared_memory_byte_size": 64,
                                    "shared_memory_offset": 64}}],
                    "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "so_in",
                                                                  "shared_memory_byte_size": 64,
                                                                  "shared_memory_offset": 128}}]}).encode()
                for conn in conns.values():
                    status, doc = post(conn, "/v2/models/add_sub/infer", body)
                    assert status == 200, doc
                    out = shm.get_contents_as_numpy(handle, np.float32, [16], offset=128)
                    np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32) + 1)
            finally:
                client.unregister_system_shared_memory("so_in")
        for conn in conns.values():  # unregistered everywhere before the call returned
            status, doc = post(conn, "/v2/models/add_sub/infer", body)
            assert status == 404 and "so_in" in doc["error"], doc  # an unknown region: 404, as Triton
            conn.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_large_input_reaches_the_worker_by_the_frontends_region(server, harness):
    wait_frontends_serving(server, harness)
    data = (np.arange(4 << 20) % 251).astype(np.uint8)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inp = grpcclient.InferInput("IN", [data.size], "UINT8")
        inp.set_data_from_numpy(data)
        result = client.infer("big_identity", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    with httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S) as client:
        inp = httpclient.InferInput("IN", [data.size], "UINT8")
        inp.set_data_from_numpy(data, binary_data=True)
        result = client.infer("big_identity", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    # the worker mapped a region a frontend created (named after the frontend's pid): the bytes went by handle
    workers = server.worker_pids("big_identity")
    fronts = frontend_pids(server)
    maps = "".join(Path(f"/proc/{pid}/maps").read_text() for pid in workers)
    assert any(f"/inferd_{pid}_" in maps for pid in fronts), "the worker never mapped a frontend's region"
    # and a frontend mapped the worker's output region: the output came by handle too
    front_maps = "".join(Path(f"/proc/{pid}/maps").read_text() for pid in fronts)
    assert any(f"/inferd_{pid}_o" in front_maps for pid in workers), "no frontend mapped a worker's output region"


def test_outputs_by_handle_are_released(server, harness):
    """The worker gets its output region back after each answer (the frontend's RELEASE): twelve 4 MiB
    answers in a row reuse a region or two instead of each holding a new one."""
    wait_frontends_serving(server, harness)
    data = np.full(4 << 20, 7, dtype=np.uint8)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inp = grpcclient.InferInput("IN", [data.size], "UINT8")
        inp.set_data_from_numpy(data)
        for _ in range(12):
            assert int(client.infer("big_identity", [inp]).as_numpy("OUT")[-1]) == 7
    worker = server.worker_pids("big_identity")[0]
    regions = {line.rsplit("/", 1)[1].split()[0] for line in Path(f"/proc/{worker}/maps").read_text().splitlines()
               if f"/inferd_{worker}_o" in line}
    assert 1 <= len(regions) <= 3, regions


def test_decoupled_stream_through_a_frontend(server, harness):
    wait_frontends_serving(server, harness)

    async def run() -> list[int]:
        got = []
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            inp = grpcaio.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([4], dtype=np.int32))

            async def requests():
                yield {"model_name": "decoupled_repeat", "inputs": [inp], "request_id": "r1"}

            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                out = result.as_numpy("OUT")
                if out is not None:
                    got.append(int(out[0]))
                if len(got) == 4:
                    break
        return got

    assert asyncio.run(asyncio.wait_for(run(), WAIT_S)) == [0, 1, 2, 3]


def test_killed_frontend_fails_its_clients_and_is_restarted(server, harness):
    conns = one_per_frontend(server, harness)
    victim, conn = next(iter(conns.items()))
    worker = server.worker_pids("sleep")
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [3.0]}]}).encode()
    conn.request("POST", "/v2/models/sleep/infer", body, {"Content-Type": "application/json"})
    server.wait_until(lambda: any(i.get("inflight") for i in server.instances("sleep")), WAIT_S,
                      "the request running in the worker (it sleeps 3 s)")
    start = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.getresponse().read()
    assert time.monotonic() - start < 2.5  # an error at once, not after the model's 3 s
    pids = server.wait_until(lambda: (p := frontend_pids(server)) and len(p) == 2 and victim not in p and p,
                             WAIT_S, "the frontend restarted")
    wait_frontends_serving(server, harness)
    assert victim not in pids
    assert server.worker_pids("sleep") == worker  # the worker and the core were not touched
    for other in conns.values():
        other.close()
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("add_sub", http_inputs(np.ones(16, np.float32), np.ones(16, np.float32)))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full(16, 2, np.float32))


def test_a_stopped_frontend_is_killed_and_restarted(server, harness):
    conns = one_per_frontend(server, harness)
    victim, conn = next(iter(conns.items()))
    os.kill(victim, signal.SIGSTOP)  # hung: alive, but its loop answers nothing
    try:
        start = time.monotonic()
        conn.request("GET", "/v2/health/ready")
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            conn.getresponse().read()  # the client gets an error once the watchdog kills it (about 5 s)
        assert time.monotonic() - start < 20.0
        server.wait_until(lambda: victim not in frontend_pids(server), WAIT_S, "the stopped frontend replaced")
        wait_frontends_serving(server, harness)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    for other in conns.values():
        other.close()
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.is_server_ready()


def test_default_on_a_small_host_is_one_process(server_factory):
    if len(os.sched_getaffinity(0)) >= 8:
        pytest.skip("this host has 8 CPUs or more: the default is several frontend processes")
    srv = server_factory(["add_sub"])
    assert frontend_pids(srv) == []
    with httpclient.InferenceServerClient(srv.http_url) as client:
        assert client.is_model_ready("add_sub")


def test_a_port_in_use_stops_the_start(tmp_path, harness):
    """As with one process: a port another server holds is an error at start, not a silent share."""
    repo = tmp_path / "repo"
    repo.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        grpc_port, metrics_port = harness.free_ports(2)
        proc = subprocess.run([str(harness.INFERD_BIN), "--model-repository", str(repo), "--http-address", "127.0.0.1",
                               "--http-port", str(port), "--grpc-port", str(grpc_port), "--metrics-port",
                               str(metrics_port), "--frontend-processes", "2"],
                              capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode != 0
    assert "address already in use" in (proc.stdout + proc.stderr).lower()


def test_load_with_file_overrides_through_a_frontend(server, harness):
    """A load carrying files (bytes on the link) reaches the core whole, and every frontend sees the result."""
    conns = one_per_frontend(server, harness)
    code = (harness.EXAMPLE_MODELS / "add_sub" / "1" / "model.py").read_bytes()
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config("add_sub")
        config["parameters"] = {"marker": {"string_value": "overridden"}}
        client.load_model("add_sub", config=json.dumps(config), files={"file:1/model.py": code})
    for conn in conns.values():  # the new config everywhere before the call returned
        conn.request("GET", "/v2/models/add_sub/config")
        resp = conn.getresponse()
        assert json.loads(resp.read())["parameters"]["marker"]["string_value"] == "overridden"
        status, doc = post(conn, "/v2/models/add_sub/infer", add_sub_body([2.0] * 16, [1.0] * 16))
        assert status == 200, doc
        assert doc["outputs"][0]["data"] == [3.0] * 16
        conn.close()
