"""The CPU image builds and keeps its contract (issue 23 item 3): built with podman from
deploy/docker/Dockerfile, run with a small /dev/shm and a read-only root filesystem, it serves examples/
over HTTP and gRPC as uid 10001, has `infer-ctl env pack`'s tools, and a `podman stop` (SIGTERM) drains it
to exit 0.

No image registry is reachable here, so the python base image must already be in podman's local storage:
`sudo deploy/docker/local-base.sh` makes a stand-in with debootstrap. Skipped without podman or that base.
Marked slow (a few minutes: the build installs the wheel's dependencies): `pytest -m slow tests/packaging`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


# Set once by the `image` fixture: global podman options and per-container limits that this host allows.
# Sandboxed hosts (hybrid cgroups, no raising of rlimits) need runc, cgroupfs and modest ulimits.
GLOBAL: list[str] = []
LIMITS: list[str] = []
SANDBOX_GLOBAL = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
SANDBOX_LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *GLOBAL, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"podman {args[0]} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    version = re.search(r"^ARG PYTHON_VERSION=(\S+)$", DOCKERFILE.read_text(), re.M).group(1)
    base = f"python:{version}-slim-bookworm"
    if podman("image", "exists", base, check=False).returncode != 0:
        pytest.skip(f"no local {base} image and no registry to pull it from (sudo deploy/docker/local-base.sh)")
    if podman("run", "--rm", base, "true", check=False).returncode != 0:
        if shutil.which("runc") is None:
            pytest.skip("podman cannot run containers here, and runc (the fallback runtime) is not installed")
        GLOBAL[:], LIMITS[:] = SANDBOX_GLOBAL, SANDBOX_LIMITS
        podman("run", "--rm", *LIMITS, base, "true")
    tag = f"localhost/inferd-test:{uuid.uuid4().hex[:8]}"
    podman("build", *LIMITS, "--pull=never", "--network=host", "-f", str(DOCKERFILE),
           "--ignorefile", str(DOCKERFILE.parent / "Dockerfile.dockerignore"), "-t", tag, str(ROOT), timeout=1200)
    yield tag
    podman("rmi", "-f", tag, check=False)


def test_image_serves_as_non_root_and_drains_on_sigterm(image: str, harness):
    http, grpc_port, metrics = harness.free_ports(3)
    name = f"inferd-test-{uuid.uuid4().hex[:8]}"
    # --read-only (with podman's tmpfs /tmp): as deploy/kubernetes runs it, readOnlyRootFilesystem + /tmp
    podman("run", "-d", *LIMITS, "--name", name, "--init", "--read-only", "--shm-size=256m", "--stop-timeout=45",
           "-p", f"127.0.0.1:{http}:8000", "-p", f"127.0.0.1:{grpc_port}:8001", "-p", f"127.0.0.1:{metrics}:8002",
           "-v", f"{ROOT / 'examples'}:/models:ro", image)
    try:
        harness.wait_for(lambda: harness.http_get(f"http://127.0.0.1:{http}/v2/models/add_sub/ready")[0] == 200,
                         180, "add_sub ready in the container")
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        shm = podman("exec", name, "df", "-k", "/dev/shm").stdout.splitlines()[-1].split()
        assert 200_000 < int(shm[1]) <= 262_144, shm  # the --shm-size the runtime gave
        podman("exec", name, "python", "-c", "import inferd.envs.packer, conda_pack")
        podman("exec", name, "infer-ctl", "env", "--help")
        status, body = harness.http_get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200 and b"nv_inference_request_success" in body

        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        a = np.arange(16, dtype=np.float32)
        for module, url in ((httpclient, f"127.0.0.1:{http}"), (grpcclient, f"127.0.0.1:{grpc_port}")):
            client = module.InferenceServerClient(url)
            inputs = [module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a)
            np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
            client.close()
        podman("stop", name, timeout=90)  # SIGTERM (STOPSIGNAL), SIGKILL only after --stop-timeout
        state = podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        logs = podman("logs", name).stdout + podman("logs", name).stderr
        assert state == "0", logs[-3000:]
    finally:
        podman("rm", "-f", name, check=False)
