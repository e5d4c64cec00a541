"""`--busy-poll-us`: a server that polls after each request answers as usual over HTTP and gRPC
(unmodified tritonclient), and goes quiet once its window has passed: no CPU spent at rest. So does a
server with the default (adaptive) window."""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest
from conftest import target_is_triton
from tritonclient.grpc import InferInput as GrpcInput
from tritonclient.http import InferInput as HttpInput

pytestmark = pytest.mark.skipif(target_is_triton(), reason="--busy-poll-us is inferd's own flag")

WINDOW_US = 50_000


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(["add_sub"], inferd_args=["--busy-poll-us", str(WINDOW_US)])


def cpu_seconds(pid: int) -> float:
    """User + system time of one process (its threads included, its workers not)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def add_sub_inputs(kind, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [kind("INPUT0", list(a.shape), "FP32"), kind("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_answers_over_http_and_grpc(server):
    rng = np.random.default_rng(7)
    http, grpc = server.http_client(), server.grpc_client()
    for i in range(20):  # back to back: each request lands while the loop is polling
        a, b = rng.random(16, dtype=np.float32), rng.random(16, dtype=np.float32)
        client, kind = (http, HttpInput) if i % 2 else (grpc, GrpcInput)
        result = client.infer("add_sub", add_sub_inputs(kind, a, b))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_quiet_at_rest(server):
    a = np.ones(16, dtype=np.float32)
    server.http_client().infer("add_sub", add_sub_inputs(HttpInput, a, a))
    time.sleep(2 * WINDOW_US / 1e6)  # the window after the last request has passed
    before = cpu_seconds(server.pid)
    time.sleep(1.0)
    spent = cpu_seconds(server.pid) - before
    # polling would spend most of that second; at rest the loop wakes for timers and heartbeats only
    assert spent < 0.3, f"the idle server spent {spent:.2f} s of CPU in 1 s"


def test_default_window_is_quiet_at_rest(server_factory):
    default = server_factory(["add_sub"])  # the default window (on with 2+ CPUs and no CPU quota)
    a = np.ones(16, dtype=np.float32)
    client = default.http_client()
    for _ in range(50):  # back to back: the window grows to its most
        np.testing.assert_allclose(client.infer("add_sub", add_sub_inputs(HttpInput, a, a)).as_numpy("OUTPUT0"), 2 * a)
    time.sleep(0.1)  # far past the default window (1 ms)
    before = cpu_seconds(default.pid)
    time.sleep(1.0)
    spent = cpu_seconds(default.pid) - before
    assert spent < 0.3, f"the idle server spent {spent:.2f} s of CPU in 1 s"


def workers_cpu(pid: int) -> float:
    """CPU seconds of the server's model workers (its frontend processes, which poll too, left out)."""
    return sum(cpu_seconds(child.pid) for child in psutil.Process(pid).children(recursive=True)
               if "frontend_processes.frontend_main" not in " ".join(child.cmdline()))


@pytest.mark.parametrize("frontends", [1, 2])
def test_workers_poll_with_the_loop_then_go_quiet(server_factory, frontends):
    """Requests one at a time open the loop's window, and each Execute sent meanwhile asks its worker to
    poll for the next one too: once it has answered, the worker spends CPU waiting (instead of sleeping)
    until the window has passed, then none. (A long window: CPU time is counted in 10 ms ticks.) The loop
    rightly stops asking while more processes are runnable than there are CPUs, which a busy test machine
    may be at that moment: the burst is tried up to five times, and one of them must show the polling.
    With frontend processes add_sub's requests go straight from a frontend to its worker: that frontend's
    loop polls and asks, and the worker polls over all its sockets."""
    window_s = 0.4
    polled = server_factory(["add_sub"], inferd_args=["--busy-poll-us", str(int(window_s * 1e6)),
                                                      "--frontend-processes", str(frontends)])
    a = np.ones(16, dtype=np.float32)
    client = polled.http_client()
    polling = 0.0
    for _attempt in range(5):
        for _ in range(5):  # back to back: the window is open when the last ones are sent
            client.infer("add_sub", add_sub_inputs(HttpInput, a, a))
        before = workers_cpu(polled.pid)
        time.sleep(window_s / 2)  # within the window after the last answer
        polling = workers_cpu(polled.pid) - before
        if polling > 0.02:
            break
    time.sleep(window_s)
    before = workers_cpu(polled.pid)
    time.sleep(1.0)
    resting = workers_cpu(polled.pid) - before
    assert polling > 0.02, f"the worker spent {polling * 1e3:.0f} ms of CPU in half its window"
    assert resting < 0.1, f"the idle worker spent {resting:.2f} s of CPU in 1 s"
