"""CUDA shared memory on an NVIDIA GPU with unmodified tritonclient (`tritonclient.utils.cuda_shared_memory`):
64 MiB input and output over HTTP and gRPC to a Python identity model on the GPU (the worker gets its input
on the device: no host round trip) and to one on the CPU (a device copy); a region unregistered while a
request uses it; a client that exits with its region registered. Marked `gpu` (make test-gpu); skipped
where no GPU, no cuda-python or no CUDA runtime is present. The same paths on a CPU, with a fake device:
tests/e2e/test_cuda_shm_datapath.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.inferd_only]

N = 16 << 20  # FP32 elements: 64 MiB tensors
MODEL = textwrap.dedent('''
    import json, os, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                params = json.loads(request.parameters() or "{}")
                if params.get("marker"):
                    open(params["marker"], "w").close()  # the request reached the model
                    deadline = time.monotonic() + 60
                    while not os.path.exists(params["marker"] + ".go") and time.monotonic() < deadline:
                        time.sleep(0.01)
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                out = pb_utils.Tensor.from_dlpack("OUTPUT0", x)  # on the device it arrived on
                on_gpu = pb_utils.Tensor("ON_GPU", np.array([not x.is_cpu()], dtype=np.bool_))
                responses.append(pb_utils.InferenceResponse([out, on_gpu]))
            return responses
''')


def _config(name: str, kind: str) -> str:
    return textwrap.dedent(f'''
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
                 {{ name: "ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] }} ]
        instance_group [ {{ count: 1 kind: {kind} {"gpus: [ 0 ]" if kind == "KIND_GPU" else ""} }} ]
        parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: {{ string_value: "no" }} }}
    ''')


def _cudashm():
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")):
        pytest.skip("no NVIDIA GPU on this machine")
    pytest.importorskip("cuda.bindings", reason="tritonclient's cuda_shared_memory needs cuda-python")
    import tritonclient.utils.cuda_shared_memory as cudashm

    return cudashm


@pytest.fixture(scope="module")
def server(module_server_factory, tmp_path_factory):
    _cudashm()
    repo = tmp_path_factory.mktemp("cudashm_models")
    for name, kind in (("ident_gpu", "KIND_GPU"), ("ident_cpu", "KIND_CPU")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_config(name, kind))
        (repo / name / "1" / "model.py").write_text(MODEL)
    return module_server_factory(repo=repo, wait_ready=["ident_gpu", "ident_cpu"],
                                 inferd_args=["--allow-client-shm", "true"])


@pytest.fixture
def regions():
    cudashm = _cudashm()
    made = []

    def make(name: str, nbytes: int):
        made.append(cudashm.create_shared_memory_region(name, nbytes, 0))
        return made[-1]

    yield make
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


def test_advertised(server) -> None:
    client = server.http_client()
    try:
        assert "cuda_shared_memory" in client.get_server_metadata()["extensions"]
    finally:
        client.close()


def _flag(cudashm, handle) -> bool:
    return bool(cudashm.get_contents_as_numpy(handle, np.bool_, [1])[0])


# every output goes to a CUDA region: the GPU model's OUTPUT0 is copied device to device into it, ON_GPU
# (a host array) host to device; the CPU model's outputs both host to device
@pytest.mark.parametrize("model, on_gpu", [("ident_gpu", True), ("ident_cpu", False)])
def test_http_64mib_through_cuda_shm(server, regions, model, on_gpu) -> None:
    import tritonclient.http as httpclient

    cudashm = _cudashm()
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    h_in, h_out, h_flag = regions("h_in", x.nbytes), regions("h_out", x.nbytes), regions("h_flag", 64)
    cudashm.set_shared_memory_region(h_in, [x])
    client = server.http_client(network_timeout=120)
    try:
        client.register_cuda_shared_memory("h_in", cudashm.get_raw_handle(h_in), 0, x.nbytes)
        client.register_cuda_shared_memory("h_out", cudashm.get_raw_handle(h_out), 0, x.nbytes)
        client.register_cuda_shared_memory("h_flag", cudashm.get_raw_handle(h_flag), 0, 64)
        inp = httpclient.InferInput("INPUT0", [N], "FP32")
        inp.set_shared_memory("h_in", x.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        out.set_shared_memory("h_out", x.nbytes)
        flag = httpclient.InferRequestedOutput("ON_GPU", binary_data=True)
        flag.set_shared_memory("h_flag", 1)
        client.infer(model, [inp], outputs=[out, flag])
        assert _flag(cudashm, h_flag) is on_gpu
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(h_out, np.float32, [N]), x)
        # an output outside CUDA memory too: all outputs come back through the host
        result = client.infer(model, [inp], outputs=[out, httpclient.InferRequestedOutput("ON_GPU")])
        assert bool(result.as_numpy("ON_GPU")[0]) is on_gpu
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(h_out, np.float32, [N]), x)
    finally:
        client.unregister_cuda_shared_memory()
        client.close()


@pytest.mark.parametrize("model, on_gpu", [("ident_gpu", True), ("ident_cpu", False)])
def test_grpc_64mib_through_cuda_shm(server, regions, model, on_gpu) -> None:
    import tritonclient.grpc as grpcclient

    cudashm = _cudashm()
    x = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    h_in, h_out, h_flag = regions("g_in", x.nbytes), regions("g_out", x.nbytes), regions("g_flag", 64)
    cudashm.set_shared_memory_region(h_in, [x])
    client = server.grpc_client()
    try:
        client.register_cuda_shared_memory("g_in", cudashm.get_raw_handle(h_in), 0, x.nbytes)
        client.register_cuda_shared_memory("g_out", cudashm.get_raw_handle(h_out), 0, x.nbytes)
        client.register_cuda_shared_memory("g_flag", cudashm.get_raw_handle(h_flag), 0, 64)
        assert set(client.get_cuda_shared_memory_status().regions) == {"g_in", "g_out", "g_flag"}
        inp = grpcclient.InferInput("INPUT0", [N], "FP32")
        inp.set_shared_memory("g_in", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("g_out", x.nbytes)
        flag = grpcclient.InferRequestedOutput("ON_GPU")
        flag.set_shared_memory("g_flag", 1)
        client.infer(model, [inp], outputs=[out, flag], client_timeout=120)
        assert _flag(cudashm, h_flag) is on_gpu
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(h_out, np.float32, [N]), x)
    finally:
        client.unregister_cuda_shared_memory()
        client.close()


def test_bad_registrations_are_refused(server, regions) -> None:
    from tritonclient.utils import InferenceServerException

    cudashm = _cudashm()
    h = regions("bad", 4096)
    client = server.http_client()
    try:
        for raw, device, size, reason in [
            (cudashm.get_raw_handle(h), 0, 1 << 30, "exceeds the allocation"),
            (cudashm.get_raw_handle(h), 99, 4096, "device_id 99 is not a GPU of this server"),
            (__import__("base64").b64encode(b"\x01" * 64), 0, 16, "cannot open the CUDA IPC handle"),
        ]:
            with pytest.raises(InferenceServerException) as info:
                client.register_cuda_shared_memory("bad", raw, device, size)
            assert info.value.status() == "400" and reason in str(info.value), str(info.value)
        assert client.get_cuda_shared_memory_status() == []
        assert client.is_server_live()
    finally:
        client.close()


def test_unregister_while_a_request_uses_the_region(server, regions, tmp_path) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    cudashm = _cudashm()
    x = np.arange(1 << 20, dtype=np.float32)
    h_in, h_out = regions("u_in", x.nbytes), regions("u_out", x.nbytes)
    cudashm.set_shared_memory_region(h_in, [x])
    client = server.http_client(network_timeout=120)
    marker = tmp_path / "reached"
    outcome: dict[str, object] = {}

    def infer() -> None:
        c = server.http_client(network_timeout=120)
        try:
            inp = httpclient.InferInput("INPUT0", [x.size], "FP32")
            inp.set_shared_memory("u_in", x.nbytes)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            out.set_shared_memory("u_out", x.nbytes)
            c.infer("ident_gpu", [inp], outputs=[out], parameters={"marker": str(marker)})
            outcome["ok"] = True
        except InferenceServerException as exc:
            outcome["error"] = exc
        finally:
            c.close()

    try:
        client.register_cuda_shared_memory("u_in", cudashm.get_raw_handle(h_in), 0, x.nbytes)
        client.register_cuda_shared_memory("u_out", cudashm.get_raw_handle(h_out), 0, x.nbytes)
        t = threading.Thread(target=infer)
        t.start()
        start = time.monotonic()
        while not marker.exists():
            assert time.monotonic() - start < 120, "the request never reached the model"
            t.join(0.02)
        # the model holds the input on the device right now: refused, as Triton 2.51 refuses (issue 43)
        with pytest.raises(InferenceServerException) as info:
            client.unregister_cuda_shared_memory()
        assert "Failed to unregister the following cuda shared memory regions: u_in ,u_out ," in str(info.value)
        (tmp_path / "reached.go").touch()
        t.join(120)
        assert not t.is_alive()
        assert outcome.get("ok"), outcome
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(h_out, np.float32, [x.size]), x)
        client.unregister_cuda_shared_memory()  # free once the request is done
        # the server and its worker are fine; the names are free again
        client.register_cuda_shared_memory("u_in", cudashm.get_raw_handle(h_in), 0, x.nbytes)
        client.register_cuda_shared_memory("u_out", cudashm.get_raw_handle(h_out), 0, x.nbytes)
        inp = httpclient.InferInput("INPUT0", [x.size], "FP32")
        inp.set_shared_memory("u_in", x.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        out.set_shared_memory("u_out", x.nbytes)
        client.infer("ident_gpu", [inp], outputs=[out])
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(h_out, np.float32, [x.size]), x)
    finally:
        (tmp_path / "reached.go").touch()
        client.unregister_cuda_shared_memory()
        client.close()


CLIENT = textwrap.dedent('''
    import sys
    import numpy as np
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm
    h = cudashm.create_shared_memory_region("orphan", 4096, 0)
    cudashm.set_shared_memory_region(h, [np.arange(1024, dtype=np.float32)])
    c = httpclient.InferenceServerClient(sys.argv[1])
    c.register_cuda_shared_memory("orphan", cudashm.get_raw_handle(h), 0, 4096)
    # exits without unregistering or freeing the region
''')


def test_client_exiting_with_its_region_registered(server, regions) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    cudashm = _cudashm()
    subprocess.run([sys.executable, "-c", CLIENT, server.http_url], check=True, timeout=120)
    client = server.http_client(network_timeout=120)
    try:
        # documented behaviour: the region stays registered (the server's mapping keeps the allocation)
        assert client.get_cuda_shared_memory_status("orphan") == [
            {"name": "orphan", "device_id": 0, "byte_size": 4096}]
        h_out = regions("orphan_out", 4096)
        client.register_cuda_shared_memory("orphan_out", cudashm.get_raw_handle(h_out), 0, 4096)
        for model in ("ident_cpu", "ident_gpu"):
            inp = httpclient.InferInput("INPUT0", [1024], "FP32")
            inp.set_shared_memory("orphan", 4096)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            out.set_shared_memory("orphan_out", 4096)
            try:
                client.infer(model, [inp], outputs=[out])  # the bytes are whatever the memory holds
            except InferenceServerException as exc:
                # the CPU model reads through the supervisor's mapping, opened at registration; a GPU worker
                # opening the handle only now, after its exporter exited, may be refused: a 400, no crash
                assert model == "ident_gpu" and exc.status() == "400", str(exc)
                assert "cannot open CUDA shared memory region 'orphan'" in str(exc)
        client.unregister_cuda_shared_memory("orphan")
        assert [r["name"] for r in client.get_cuda_shared_memory_status()] == ["orphan_out"]
        assert client.is_server_live() and client.is_model_ready("ident_gpu")
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
