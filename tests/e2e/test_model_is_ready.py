"""A Python model's own `is_ready()` (python_backend after Triton 2.51, issue 43 item 4), as the current Triton
answers with it (server qa L0_backend_python/model_readiness): /v2/models/<m>/ready and the gRPC ModelReady
call it; True is ready, False, an exception or a value that is no bool is not; `async def is_ready` works; a
check that takes longer than 5 s is "not ready" for its request while the next request waits for that check
and takes its answer; inference is not affected; with --strict-readiness the server is ready only while
every such model is; pb_utils.is_model_ready and BLS calls into the model see the same answer.

Triton 2.51 has no is_ready() (it never calls it), so this module is inferd_only."""

from __future__ import annotations

import concurrent.futures
import os
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = pytest.mark.inferd_only

MODEL = '''
import asyncio
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.mode = params.get("READINESS", {}).get("string_value", "true")
        self.delay = float(params.get("DELAY", {}).get("string_value", "0"))
        self.flag = params.get("FLAG", {}).get("string_value", "")
        self.gate = params.get("GATE", {}).get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if self.gate and x.size and x.flat[0] < 0:  # hold the instance until the test writes the FIFO
                with open(self.gate, "rb") as fifo:
                    fifo.read(1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''

SYNC_CHECK = '''
    def is_ready(self):
        if self.delay:
            time.sleep(self.delay)
        if self.mode == "false":
            return False
        if self.mode == "raise":
            raise RuntimeError("the database is unreachable")
        if self.mode == "non_bool":
            return "ready"
        if self.mode == "file":
            return os.path.exists(self.flag)
        return True
'''

ASYNC_CHECK = '''
    async def is_ready(self):
        await asyncio.sleep(0.05)
        return self.mode == "true"
'''

CALLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy().flat[0].decode()
            ready = pb_utils.is_model_ready(name)
            call = pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT0"],
                                             inputs=[pb_utils.Tensor("INPUT0", np.ones(2, np.float32))])
            answer = call.exec()
            error = answer.error().message() if answer.has_error() else ""
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("READY", np.array([ready])),
                pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=np.object_))]))
        return responses
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters [ {{ key: "READINESS" value: {{ string_value: "{mode}" }} }},
             {{ key: "DELAY" value: {{ string_value: "{delay}" }} }},
             {{ key: "FLAG" value: {{ string_value: "{flag}" }} }},
             {{ key: "GATE" value: {{ string_value: "{gate}" }} }} ]
'''

CALLER_CONFIG = '''
name: "caller"
backend: "python"
max_batch_size: 0
input [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "READY" data_type: TYPE_BOOL dims: [ 1 ] }, { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def add_model(repo: Path, name: str, mode: str = "true", check: str = SYNC_CHECK, *, delay: float = 0,
              flag: str = "", gate: str = "", count: int = 1) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL + check)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(
        name=name, mode=mode, delay=delay, flag=flag, gate=gate, count=count)))


def ready_both(server, name: str) -> tuple[bool, bool]:
    http = server.http_client()
    grpc = server.grpc_client()
    try:
        return http.is_model_ready(name), grpc.is_model_ready(name)
    finally:
        http.close()
        grpc.close()


def infer_ok(server, name: str, value: float = 1.0) -> None:
    client = server.http_client()
    try:
        data = np.full(3, value, np.float32)
        tensor = httpclient.InferInput("INPUT0", [3], "FP32")
        tensor.set_data_from_numpy(data)
        assert np.array_equal(client.infer(name, [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("is_ready")
    repo = root / "models"
    flag = root / "flag"
    flag.write_text("")
    gate = root / "gate"
    os.mkfifo(gate)
    add_model(repo, "ready_true", "true", count=2)
    add_model(repo, "ready_false", "false")
    add_model(repo, "ready_raises", "raise")
    add_model(repo, "ready_non_bool", "non_bool")
    add_model(repo, "ready_async", "true", ASYNC_CHECK)
    add_model(repo, "ready_async_false", "false", ASYNC_CHECK)
    add_model(repo, "ready_file", "file", flag=str(flag))
    add_model(repo, "ready_gated", "true", gate=str(gate))
    add_model(repo, "no_check", "true", check="")
    (repo / "caller" / "1").mkdir(parents=True)
    (repo / "caller" / "1" / "model.py").write_text(CALLER)
    (repo / "caller" / "config.pbtxt").write_text(CALLER_CONFIG)
    return repo


READY_AT_START = ["ready_true", "ready_async", "ready_file", "ready_gated", "no_check", "caller"]


@pytest.fixture(scope="module")
def server(module_server_factory, repo):
    return module_server_factory(repo=repo, wait_ready=READY_AT_START,
                                 extra_args=["--strict-readiness", "false", "--log-verbose", "1"])


def test_a_check_saying_true_is_ready_on_both_protocols(server):
    for _ in range(3):
        assert ready_both(server, "ready_true") == (True, True)
        assert ready_both(server, "ready_async") == (True, True)
        infer_ok(server, "ready_true")


@pytest.mark.parametrize("name", ["ready_false", "ready_raises", "ready_non_bool", "ready_async_false"])
def test_false_an_exception_or_no_bool_is_not_ready_and_inference_goes_on(server, name):
    for _ in range(3):
        assert ready_both(server, name) == (False, False)
        assert server.get(f"/v2/models/{name}/versions/1/ready")[0] == 400
        infer_ok(server, name)  # readiness is the model's word; requests still run
    assert ready_both(server, "ready_true") == (True, True)


def test_the_log_says_why_at_verbose_level(server):
    assert ready_both(server, "ready_false") == (False, False)
    assert ready_both(server, "ready_raises") == (False, False)
    assert ready_both(server, "ready_non_bool") == (False, False)
    log = server.log()
    assert ("Model 'ready_false' version 1 is not ready: Model 'ready_false_0_0' is not ready "
            "(user-defined check failed).") in log
    assert "Model 'ready_raises' version 1 is not ready: RuntimeError: the database is unreachable" in log
    assert "Model 'ready_non_bool' version 1 is not ready: is_ready() must return a boolean value" in log


def test_each_request_asks_the_model_again(server, repo):
    flag = repo.parent / "flag"
    assert ready_both(server, "ready_file") == (True, True)
    flag.unlink()  # e.g. a drain signal: the orchestrator stops sending traffic
    try:
        assert ready_both(server, "ready_file") == (False, False)
    finally:
        flag.write_text("")
    assert ready_both(server, "ready_file") == (True, True)


def test_the_check_is_answered_while_the_instance_executes(server, repo):
    """is_ready() runs beside execute (as python_backend runs it on the stub's other thread): an instance
    busy in a long execute still answers."""
    gate = repo.parent / "gate"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(infer_ok, server, "ready_gated", -1.0)  # held inside execute until the FIFO opens
        try:
            for _ in range(3):
                assert ready_both(server, "ready_gated") == (True, True)
            assert not busy.done()
        finally:
            with open(gate, "wb") as fifo:
                fifo.write(b"x")
        busy.result(timeout=30)


def test_concurrent_readiness_and_inference(server):
    errors: list[BaseException] = []

    def ready() -> None:
        try:
            assert ready_both(server, "ready_true") == (True, True)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    def infer() -> None:
        try:
            infer_ok(server, "ready_true")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=f) for _ in range(8) for f in (ready, infer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_bls_sees_the_models_answer(server):
    client = server.http_client()
    try:
        for name, ready in (("ready_true", True), ("ready_false", False)):
            tensor = httpclient.InferInput("NAME", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([name.encode()], dtype=np.object_))
            result = client.infer("caller", [tensor])
            assert result.as_numpy("READY").tolist() == [ready]
            error = result.as_numpy("ERROR")[0].decode()
            if ready:
                assert error == ""
            else:  # python_backend asks the callee's readiness before each BLS call
                assert f"Model '{name}' is not ready." in error
    finally:
        client.close()


def test_strict_readiness_counts_the_models_check(server_factory, tmp_path):
    repo = tmp_path / "models"
    flag = tmp_path / "flag"
    flag.write_text("")
    add_model(repo, "ready_file", "file", flag=str(flag))
    add_model(repo, "no_check", "true", check="")
    server = server_factory(repo=repo, wait_ready=["ready_file", "no_check"],
                            extra_args=["--strict-readiness", "true"])
    http = server.http_client()
    grpc = server.grpc_client()
    try:
        server.wait_until(http.is_server_ready, 30, "server ready")  # (once the start-up loads are done)
        assert grpc.is_server_ready()
        flag.unlink()
        assert not http.is_server_ready() and not grpc.is_server_ready()
        assert not http.is_model_ready("ready_file") and http.is_model_ready("no_check")
        flag.write_text("")
        assert http.is_server_ready() and grpc.is_server_ready()
    finally:
        http.close()
        grpc.close()


def test_with_frontend_processes(server_factory, tmp_path):
    repo = tmp_path / "models"
    add_model(repo, "ready_false", "false")
    add_model(repo, "ready_true", "true")
    server = server_factory(repo=repo, wait_ready=["ready_true"],
                            inferd_args=["--frontend-processes", "2", "--strict-readiness", "false"])
    for _ in range(4):  # each connection may land on either frontend process
        assert ready_both(server, "ready_false") == (False, False)
        assert ready_both(server, "ready_true") == (True, True)


@pytest.mark.slow
def test_a_check_over_five_seconds_is_not_ready_and_the_next_request_takes_its_answer(server_factory, tmp_path):
    """python_backend's timeout (5 s): the request that asked is answered "not ready"; the check runs on, and
    the next request waits for it (up to 5 s of its own) instead of starting another, and gets its True."""
    repo = tmp_path / "models"
    add_model(repo, "ready_slow", "true", delay=6.5)
    add_model(repo, "no_check", "true", check="")
    server = server_factory(repo=repo, wait_ready=["no_check"],
                            extra_args=["--strict-readiness", "false", "--log-verbose", "1"])
    http = server.http_client(network_timeout=60)
    grpc = server.grpc_client()
    try:
        server.wait_until(lambda: {"name": "ready_slow", "version": "1", "state": "READY"}
                          in http.get_model_repository_index(), 60, "ready_slow loaded")
        assert http.is_model_ready("ready_slow") is False
        infer_ok(server, "ready_slow")
        assert grpc.is_model_ready("ready_slow") is True
    finally:
        http.close()
        grpc.close()
    assert "Timed out waiting for user-defined is_ready() response" in server.log()


DECOUPLED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flat[0])
            sender = request.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def is_ready(self):
        return True
'''


def test_decoupled_model_streams_while_asked(server_factory, tmp_path):
    repo = tmp_path / "models"
    (repo / "repeat" / "1").mkdir(parents=True)
    (repo / "repeat" / "1" / "model.py").write_text(DECOUPLED)
    (repo / "repeat" / "config.pbtxt").write_text(
        'name: "repeat"\nbackend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    server = server_factory(repo=repo, wait_ready=["repeat"])
    got: list = []
    done = threading.Event()

    def callback(result, error):
        got.append(error or result.as_numpy("OUT").tolist())
        if error is not None or len(got) == 8:
            done.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=callback)
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([8], np.int32))
        client.async_stream_infer("repeat", [tensor])
        for _ in range(5):
            assert ready_both(server, "repeat") == (True, True)
        assert done.wait(30)
        client.stop_stream()
    finally:
        client.close()
    assert got == [[8]] * 8
