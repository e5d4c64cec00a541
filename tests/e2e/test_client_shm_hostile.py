"""Hostile client shared memory (issue 18 items 1 and 2), against a real server with tritonclient:

- a registered region that shrinks, vanishes or is rewritten after registration never crashes the
  supervisor: the request gets a 400 naming the region and the server keeps serving;
- an object the server (or one of its workers) created cannot be registered, whatever name reaches it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid

import numpy as np
import psutil
import pytest

pytestmark = pytest.mark.inferd_only

httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

MODEL = "identity_fp32"


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory([MODEL], extra_args=["--allow-client-shm=true"])


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    yield c
    try:
        c.unregister_system_shared_memory()
    finally:
        c.close()


def make_object(size: int) -> tuple[str, int]:
    key = f"/hostile_{uuid.uuid4().hex[:12]}"
    fd = os.open("/dev/shm" + key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return key, fd


def remove(key: str, fd: int) -> None:
    os.close(fd)
    if os.path.exists("/dev/shm" + key):
        os.unlink("/dev/shm" + key)


def infer_from(client, region: str, n: int, out_region: str | None = None):
    inp = httpclient.InferInput("INPUT0", [n], "FP32")
    inp.set_shared_memory(region, n * 4)
    outputs = None
    if out_region is not None:
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(out_region, n * 4)
        outputs = [out]
    return client.infer(MODEL, [inp], outputs=outputs)


def assert_serving(client) -> None:
    data = np.arange(8, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [8], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("change", ["truncate", "truncate_partly", "unlink_and_truncate"])
def test_shrunk_input_region_is_a_400_naming_it(server, client, change):
    n = 1 << 16  # 256 KiB: several pages past the new end
    key, fd = make_object(n * 4)
    name = "in_" + uuid.uuid4().hex[:8]
    try:
        os.pwrite(fd, np.arange(n, dtype=np.float32).tobytes(), 0)
        client.register_system_shared_memory(name, key, n * 4)
        assert infer_from(client, name, n).as_numpy("OUTPUT0")[-1] == n - 1
        if change == "unlink_and_truncate":
            os.unlink("/dev/shm" + key)
        os.ftruncate(fd, 4096 if change == "truncate_partly" else 0)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as exc:
            infer_from(client, name, n)
        elapsed = time.monotonic() - started
        assert exc.value.status() == "400", exc.value
        assert name in exc.value.message()
        assert server.alive(), server.log_tail()
        assert elapsed < 5.0
        assert_serving(client)
    finally:
        remove(key, fd)


def test_shrunk_input_region_over_grpc_is_invalid_argument(server, client):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    n = 1 << 16
    key, fd = make_object(n * 4)
    name = "g_" + uuid.uuid4().hex[:8]
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        g.register_system_shared_memory(name, key, n * 4)
        inp = grpcclient.InferInput("INPUT0", [n], "FP32")
        inp.set_shared_memory(name, n * 4)
        g.infer(MODEL, [inp])
        os.ftruncate(fd, 0)
        with pytest.raises(InferenceServerException) as exc:
            g.infer(MODEL, [inp])
        assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and name in exc.value.message()
        assert server.alive(), server.log_tail()
        assert_serving(client)
    finally:
        remove(key, fd)
        with contextlib.suppress(Exception):
            g.unregister_system_shared_memory()
        g.close()


def test_shrunk_output_region_is_a_400_naming_it(server, client):
    n = 1 << 16
    key_in, fd_in = make_object(n * 4)
    key_out, fd_out = make_object(n * 4)
    try:
        client.register_system_shared_memory("hin", key_in, n * 4)
        client.register_system_shared_memory("hout", key_out, n * 4)
        os.pwrite(fd_in, np.full(n, 7, dtype=np.float32).tobytes(), 0)
        infer_from(client, "hin", n, "hout")
        assert os.pread(fd_out, 8, 0) == np.full(2, 7, dtype=np.float32).tobytes()
        os.ftruncate(fd_out, 0)
        with pytest.raises(InferenceServerException) as exc:
            infer_from(client, "hin", n, "hout")
        assert exc.value.status() == "400" and "hout" in exc.value.message()
        assert os.fstat(fd_out).st_size == 0  # never grown back behind the client's back
        assert server.alive(), server.log_tail()
        assert_serving(client)
    finally:
        remove(key_in, fd_in)
        remove(key_out, fd_out)


def test_rewritten_region_is_read_as_it_is_now(server, client):
    key, fd = make_object(4096)
    try:
        client.register_system_shared_memory("rw", key, 4096)
        for value in (1.0, 2.0):
            os.pwrite(fd, np.full(16, value, dtype=np.float32).tobytes(), 0)
            assert infer_from(client, "rw", 16).as_numpy("OUTPUT0")[0] == value
    finally:
        remove(key, fd)


def _server_regions(server) -> dict[str, int]:
    """The shared-memory objects the server and its workers created and map: {name: pid of a mapper},
    read from /proc/<pid>/maps (whether or not the name still exists under /dev/shm)."""
    found: dict[str, int] = {}
    for pid in (server.pid, *server.worker_pids()):
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                if path.startswith("/dev/shm/inferd_"):
                    found.setdefault(path[len("/dev/shm/"):].removesuffix(" (deleted)"), pid)
    return found


def _fd_of(pid: int, name: str) -> int | None:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/" + name):
                return int(fd)
        except OSError:
            continue
    return None


def test_server_objects_cannot_be_registered(server, client):
    # a large input makes the supervisor create a pool region; a large output, a worker arena region
    data = np.ones(1 << 18, dtype=np.float32)  # 1 MiB
    inp = httpclient.InferInput("INPUT0", [data.size], "FP32")
    inp.set_data_from_numpy(data)
    client.infer(MODEL, [inp])
    regions = _server_regions(server)
    # the pool region is the supervisor's, or a frontend process's with --frontend-processes N > 1
    pools = {server.pid} | {p.pid for p in psutil.Process(server.pid).children()
                            if "frontend_processes.frontend_main" in " ".join(p.cmdline())}
    assert any(int(r.split("_")[1]) in pools for r in regions), regions
    assert any(int(r.split("_")[1]) not in pools for r in regions), regions
    alias = f"alias_{uuid.uuid4().hex[:8]}"
    try:
        for region, pid in regions.items():
            keys = ["/" + region, "/" + region.rsplit(".", 2)[0]]  # its name (a handle), its stem
            fd = _fd_of(pid, region)
            if fd is not None:  # another name for the same object, if the kernel lets one be made
                try:
                    os.link(f"/proc/{pid}/fd/{fd}", "/dev/shm/" + alias, follow_symlinks=True)
                    keys.append("/" + alias)
                except OSError:
                    pass  # an unlinked file cannot be given a name again: nothing to steal by
            for key in keys:
                with pytest.raises(InferenceServerException) as exc:
                    client.register_system_shared_memory("stolen", key, 4096)
                assert exc.value.status() == "400", exc.value
                msg = exc.value.message()
                assert "created by this server" in msg or "No such file" in msg, msg
            if os.path.exists("/dev/shm/" + alias):
                os.unlink("/dev/shm/" + alias)
        assert client.get_system_shared_memory_status() == []
    finally:
        if os.path.exists("/dev/shm/" + alias):
            os.unlink("/dev/shm/" + alias)
    assert server.alive()
