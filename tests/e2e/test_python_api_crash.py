"""kill -9 of the process hosting bound functions (issue 27 item 2): the server it started exits and
nothing is left: no process, nothing in /dev/shm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import free_ports, leak_free, pid_alive, shm_snapshot, wait_for

pytestmark = pytest.mark.inferd_only

PROGRAM = Path(__file__).with_name("pyapi_user_program.py")


def test_kill_9_of_the_user_process_stops_the_server_and_leaves_nothing():
    before = shm_snapshot()
    http, grpc, metrics = free_ports(3)
    user = subprocess.Popen([sys.executable, str(PROGRAM), str(http), str(grpc), str(metrics)],
                            stdout=subprocess.PIPE, text=True, cwd=str(PROGRAM.parents[2]))
    try:
        assert user.stdout is not None
        line = user.stdout.readline()  # READY <server pid> (or EOF if it failed)
        assert line.startswith("READY"), "the user program did not start: %r" % line
        server_pid = int(line.split()[1])
        client = httpclient.InferenceServerClient("127.0.0.1:%d" % http, network_timeout=30)
        data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: in through the pool, out through the host's arena
        inp = httpclient.InferInput("INPUT0", [1, data.size], "FP32")
        inp.set_data_from_numpy(data[None])
        np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0")[0], data)
        client.close()
        user.send_signal(signal.SIGKILL)
        user.wait(timeout=30)
        wait_for(lambda: not pid_alive(server_pid), 60, "the server to exit after its host process died")
        wait_for(lambda: shm_snapshot() == before, 30, "/dev/shm to be as it was")
        leftovers = [n for n in os.listdir("/dev/shm") if n.startswith(("inferd_%d_" % server_pid,
                                                                         "inferd_%d_" % user.pid))]
        assert leftovers == []
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()


def test_a_frozen_host_is_killed_as_hung_and_its_instance_restarted():
    """SIGSTOP of the host: the server hears no heartbeat, kills the instance (a `kill` on the link, answered
    with `exited` once the host runs again) and starts a new one, which serves."""
    import json
    import urllib.request

    http, grpc, metrics = free_ports(3)
    user = subprocess.Popen([sys.executable, str(PROGRAM), str(http), str(grpc), str(metrics)],
                            stdout=subprocess.PIPE, text=True, cwd=str(PROGRAM.parents[2]))

    def instance() -> dict:
        body = urllib.request.urlopen("http://127.0.0.1:%d/v2/inferd/status" % http, timeout=10).read()
        return json.loads(body)["models"][0]["instances"][0]

    try:
        assert user.stdout is not None and user.stdout.readline().startswith("READY")
        user.send_signal(signal.SIGSTOP)
        wait_for(lambda: instance()["state"] != "ready", 60, "the frozen instance to be taken out")
        user.send_signal(signal.SIGCONT)
        wait_for(lambda: instance()["state"] == "ready" and instance()["restarts"] >= 1, 60,
                 "a new instance to serve")
        assert "hung" in instance()["last_error"]
        client = httpclient.InferenceServerClient("127.0.0.1:%d" % http, network_timeout=30)
        inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        inp.set_data_from_numpy(np.ones((1, 3), np.float32))
        np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), np.ones((1, 3)))
        client.close()
    finally:
        user.send_signal(signal.SIGCONT)
        user.kill()
        user.wait()


def test_server_death_is_seen_by_the_user_process_which_keeps_no_shared_memory():
    from inferd.pytriton.decorators import batch
    from inferd.pytriton.model_config import ModelConfig, Tensor
    from inferd.pytriton.triton import Triton, TritonConfig

    before = shm_snapshot()
    http, grpc, metrics = free_ports(3)
    t = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    t.bind("m", batch(lambda X: {"Y": X}), [Tensor(name="X", dtype=np.float32, shape=(-1,))],
           [Tensor(name="Y", dtype=np.float32, shape=(-1,))], config=ModelConfig(max_batch_size=2))
    t.run()
    assert t.is_alive() and t._proc is not None
    server_pid = t._proc.pid
    client = httpclient.InferenceServerClient("127.0.0.1:%d" % http, network_timeout=30)
    data = np.arange(1 << 18, dtype=np.float32)[None]  # 1 MiB out: a region of this process's output arena
    inp = httpclient.InferInput("X", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("m", [inp]).as_numpy("Y"), data)
    client.close()
    t._proc.send_signal(signal.SIGKILL)
    wait_for(lambda: not t.is_alive(), 30, "is_alive() to turn false")
    owners = {os.getpid(), server_pid}
    wait_for(lambda: leak_free(before, shm_snapshot(), owners), 30, "the host's regions to be released")
    t.stop()


def test_external_model_without_a_host_fails_to_load(tmp_path):
    """backend "external" in a server started without --host-fd: the load fails, naming the reason."""
    import json
    import urllib.error
    import urllib.request

    model = tmp_path / "ext"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "ext"\nbackend: "external"\nmax_batch_size: 0\n'
                                        'input { name: "X" data_type: TYPE_FP32 dims: [1] }\n'
                                        'output { name: "Y" data_type: TYPE_FP32 dims: [1] }\n')
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "inferd.supervisor", "--model-repository", str(tmp_path),
                             "--model-control-mode", "explicit", "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics)])
    try:
        def live():
            try:
                return urllib.request.urlopen("http://127.0.0.1:%d/v2/health/live" % http, timeout=2).status == 200
            except OSError:
                return False

        wait_for(live, 60, "the server to start")
        req = urllib.request.Request("http://127.0.0.1:%d/v2/repository/models/ext/load" % http, data=b"",
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=60)
        assert "no host process is connected" in json.loads(err.value.read())["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
