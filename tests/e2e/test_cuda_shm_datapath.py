"""The CUDA shared-memory data path over HTTP and gRPC with unmodified tritonclient, on a CPU: the server
runs with a fake device behind memory.cuda_device's interface (fake_cuda_server.py: "device memory" is
POSIX shm), so everything but the CUDA calls is the real code. A CPU model gets its inputs copied out of
the region and its outputs written into one; bad handles, wrong devices, sizes and offsets, a region
unregistered while a request uses it and a client that exits with its region registered all get clear
answers, and the server keeps serving. The same paths on a real GPU: tests/gpu/test_cuda_shm.py."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import conftest
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent))
from fake_cuda_server import GPUS, fake_handle  # noqa: E402

pytestmark = pytest.mark.inferd_only

MODEL = textwrap.dedent('''
    import json, os, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                params = json.loads(request.parameters() or "{}")
                if params.get("marker"):
                    open(params["marker"], "w").close()  # the request reached the model
                    deadline = time.monotonic() + 30
                    while not os.path.exists(params["marker"] + ".go") and time.monotonic() < deadline:
                        time.sleep(0.01)
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
            return responses
''')
CONFIG = textwrap.dedent('''
    name: "ident_cpu"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
''')
N = 1 << 20  # FP32 elements: 4 MiB tensors


class Alloc:
    """A client "allocation" of the fake device: a /dev/shm object."""

    def __init__(self, tag: str, nbytes: int, device: int = 0) -> None:
        self.name = f"inferd_fakecuda_{os.getpid()}_{tag}"
        self.path = Path("/dev/shm") / self.name
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        os.ftruncate(fd, nbytes)
        os.close(fd)
        self.nbytes = nbytes
        self.handle = fake_handle(self.name, device)

    @property
    def b64(self) -> str:
        return base64.b64encode(self.handle).decode()

    def write(self, data: bytes, offset: int = 0) -> None:
        with open(self.path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    def read(self, nbytes: int, offset: int = 0) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(nbytes)

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(module_server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("cudarepo")
    (repo / "ident_cpu" / "1").mkdir(parents=True)
    (repo / "ident_cpu" / "config.pbtxt").write_text(CONFIG)
    (repo / "ident_cpu" / "1" / "model.py").write_text(MODEL)
    launcher = tmp_path_factory.mktemp("bin") / "inferd-fake-cuda"
    # the fake device's two GPUs are also what discovery finds (the extension needs a discovered GPU)
    script = Path(__file__).parent / "fake_cuda_server.py"
    launcher.write_text(f"#!/bin/sh\nexec env INFERD_TEST_ONLY_FAKE_GPUS={GPUS} {sys.executable} {script} \"$@\"\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conftest, "INFERD_BIN", launcher)
        yield module_server_factory(repo=repo, wait_ready=["ident_cpu"], inferd_args=["--allow-client-shm", "true"])


@pytest.fixture
def allocs():
    made: list[Alloc] = []

    def make(tag: str, nbytes: int, device: int = 0) -> Alloc:
        made.append(Alloc(tag, nbytes, device))
        return made[-1]

    yield make
    for a in made:
        a.free()


@pytest.fixture
def http(server):
    client = server.http_client()
    yield client
    client.unregister_cuda_shared_memory()
    client.close()


@pytest.fixture
def grpc(server):
    client = server.grpc_client()
    yield client
    client.unregister_cuda_shared_memory()
    client.close()


def _http_infer(http, in_region: str, out_region: str, n: int = N, offset: int = 0, **kw):
    inp = httpclient.InferInput("INPUT0", [n], "FP32")
    inp.set_shared_memory(in_region, n * 4, offset)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    out.set_shared_memory(out_region, n * 4)
    return http.infer("ident_cpu", [inp], outputs=[out], **kw)


def test_advertised_with_a_working_device(http) -> None:
    assert "cuda_shared_memory" in http.get_server_metadata()["extensions"]


def test_http_round_trip_through_cuda_regions(http, allocs) -> None:
    x = np.arange(N, dtype=np.float32)
    a_in, a_out = allocs("hin", N * 4), allocs("hout", N * 4)
    a_in.write(x.tobytes())
    http.register_cuda_shared_memory("in", a_in.b64, 0, N * 4)
    http.register_cuda_shared_memory("out", a_out.b64, 0, N * 4)
    assert sorted(http.get_cuda_shared_memory_status(), key=lambda r: r["name"]) == [
        {"name": "in", "device_id": 0, "byte_size": N * 4}, {"name": "out", "device_id": 0, "byte_size": N * 4}]
    _http_infer(http, "in", "out")
    np.testing.assert_array_equal(np.frombuffer(a_out.read(N * 4), np.float32), x)


def test_grpc_round_trip_through_cuda_regions(grpc, allocs) -> None:
    x = -np.arange(N, dtype=np.float32)
    a_in, a_out = allocs("gin", N * 4 + 64), allocs("gout", N * 4)
    a_in.write(x.tobytes(), offset=64)
    grpc.register_cuda_shared_memory("gin", a_in.b64.encode(), 0, N * 4 + 64)
    grpc.register_cuda_shared_memory("gout", a_out.b64.encode(), 0, N * 4)
    status = grpc.get_cuda_shared_memory_status()
    assert {name: (r.device_id, r.byte_size) for name, r in status.regions.items()} == {
        "gin": (0, N * 4 + 64), "gout": (0, N * 4)}
    inp = grpcclient.InferInput("INPUT0", [N], "FP32")
    inp.set_shared_memory("gin", N * 4, 64)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("gout", N * 4)
    grpc.infer("ident_cpu", [inp], outputs=[out])
    np.testing.assert_array_equal(np.frombuffer(a_out.read(N * 4), np.float32), x)


def test_registration_refusals_say_why(http, grpc, allocs) -> None:
    a = allocs("reg", 4096)
    gone = fake_handle("inferd_fakecuda_no_such_allocation")
    for name, raw, device, size, reason in [
        ("r", base64.b64encode(gone).decode(), 0, 16, "cannot open the CUDA IPC handle on device 0"),
        ("r", a.b64, 5, 16, "device_id 5 is not a GPU of this server (it has 2)"),
        ("r", a.b64, 1, 16, "cannot open the CUDA IPC handle on device 1"),
    ]:
        with pytest.raises(InferenceServerException) as info:
            http.register_cuda_shared_memory(name, raw, device, size)
        assert "failed to register shared memory region: invalid args" in str(info.value)
        assert reason in str(info.value) and info.value.status() == "400"
        with pytest.raises(InferenceServerException) as info:
            grpc.register_cuda_shared_memory(name, raw.encode(), device, size)
        assert reason in info.value.message() and info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as info:
        http.register_cuda_shared_memory("big", a.b64, 0, 4097)
    assert "failed to register shared memory region 'big': invalid args: byte_size 4097 exceeds" in str(info.value)
    http.register_cuda_shared_memory("ok", a.b64, 0, 4096)
    with pytest.raises(InferenceServerException) as info:
        grpc.register_cuda_shared_memory("ok", a.b64.encode(), 0, 4096)
    assert info.value.message() == "shared memory region 'ok' already in manager"
    assert [r["name"] for r in http.get_cuda_shared_memory_status()] == ["ok"]


def test_offsets_and_sizes_out_of_range_name_the_region(http, allocs) -> None:
    a = allocs("small", 4096)
    http.register_cuda_shared_memory("small", a.b64, 0, 4096)
    for n, offset, message in [(1024, 4096, "Invalid offset for shared memory region: 'small'"),
                               (1024, 4, "Invalid offset + byte size for shared memory region: 'small'")]:
        with pytest.raises(InferenceServerException) as info:
            _http_infer(http, "small", "small", n=n, offset=offset)
        assert message in str(info.value) and info.value.status() == "400"
    out_small = allocs("osmall", 64)
    http.register_cuda_shared_memory("osmall", out_small.b64, 0, 64)
    inp = httpclient.InferInput("INPUT0", [32], "FP32")
    inp.set_shared_memory("small", 128)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    out.set_shared_memory("osmall", 512)  # the request claims more than the region holds
    with pytest.raises(InferenceServerException) as info:
        http.infer("ident_cpu", [inp], outputs=[out])
    assert "'osmall'" in str(info.value) and info.value.status() == "400"


def test_unregister_while_a_request_uses_the_region(http, server, allocs, tmp_path) -> None:
    x = np.arange(1024, dtype=np.float32)
    a_in, a_out = allocs("uin", 4096), allocs("uout", 4096)
    a_in.write(x.tobytes())
    http.register_cuda_shared_memory("uin", a_in.b64, 0, 4096)
    http.register_cuda_shared_memory("uout", a_out.b64, 0, 4096)
    marker = tmp_path / "reached"
    outcome: dict[str, object] = {}

    def run() -> None:
        client = server.http_client()
        try:
            _http_infer(client, "uin", "uout", n=1024, parameters={"marker": str(marker)})
            outcome["ok"] = True
        except InferenceServerException as exc:
            outcome["error"] = exc
        finally:
            client.close()

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = 60.0
        start = time.monotonic()
        while not marker.exists():  # the request is inside the model
            assert time.monotonic() - start < deadline, "the request never reached the model"
            t.join(0.02)
        # both regions, while the request holds them: refused as Triton 2.51 refuses (issue 43 item 10)
        with pytest.raises(InferenceServerException) as info:
            http.unregister_cuda_shared_memory()
        assert "Failed to unregister the following cuda shared memory regions: uin ,uout ," in str(info.value)
        with pytest.raises(InferenceServerException) as info:
            http.unregister_cuda_shared_memory("uout")
        assert "Cannot unregister shared memory region 'uout', it is currently in use." in str(info.value)
        assert sorted(r["name"] for r in http.get_cuda_shared_memory_status()) == ["uin", "uout"]
    finally:
        Path(str(marker) + ".go").touch()
        t.join(60)
    assert not t.is_alive()
    assert outcome.get("ok"), outcome  # the request kept its regions and wrote its output
    np.testing.assert_array_equal(np.frombuffer(a_out.read(4096), np.float32), x)
    http.unregister_cuda_shared_memory()  # free once the request is done
    assert http.get_cuda_shared_memory_status() == []
    a_out.write(bytes(4096))
    # the server is fine, and the names are free again
    http.register_cuda_shared_memory("uin", a_in.b64, 0, 4096)
    http.register_cuda_shared_memory("uout", a_out.b64, 0, 4096)
    _http_infer(http, "uin", "uout", n=1024)
    np.testing.assert_array_equal(np.frombuffer(a_out.read(4096), np.float32), x)


CLIENT = textwrap.dedent('''
    import base64, os, sys
    import tritonclient.http as httpclient
    sys.path.insert(0, sys.argv[3])
    from fake_cuda_server import fake_handle
    path = "/dev/shm/" + sys.argv[2]
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 16)
    client = httpclient.InferenceServerClient(sys.argv[1])
    client.register_cuda_shared_memory("orphan", base64.b64encode(fake_handle(sys.argv[2])).decode(), 0, 4096)
    os.unlink(path)  # the client frees its memory and exits without unregistering
''')


def test_client_exiting_with_its_region_registered(http, server, allocs) -> None:
    name = f"inferd_fakecuda_{os.getpid()}_orphan"
    subprocess.run([sys.executable, "-c", CLIENT, server.http_url, name, str(Path(__file__).parent)],
                   check=True, timeout=60)
    assert not (Path("/dev/shm") / name).exists()
    # the server's mapping keeps the memory: the region stays registered and readable until unregistered
    assert http.get_cuda_shared_memory_status("orphan") == [{"name": "orphan", "device_id": 0, "byte_size": 4096}]
    out = allocs("orphan_out", 4096)
    http.register_cuda_shared_memory("orphan_out", out.b64, 0, 4096)
    _http_infer(http, "orphan", "orphan_out", n=1024)
    assert out.read(4096) == bytes(range(256)) * 16
    http.unregister_cuda_shared_memory("orphan")
    with pytest.raises(InferenceServerException) as info:
        _http_infer(http, "orphan", "orphan_out", n=1024)
    assert "Unable to find shared memory region: 'orphan'" in str(info.value)
    assert http.is_server_live()
