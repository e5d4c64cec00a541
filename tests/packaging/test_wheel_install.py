"""The released artefacts work on their own (issue 23 item 1): `python -m build` makes an sdist and a wheel
that `twine check` accepts, the sdist carries what rebuilding needs (protos/, not the generated modules), and
the wheel, installed into a fresh venv with nothing of the checkout on its path, serves examples/ with one
inference over HTTP and one over gRPC.

Marked slow (it builds with isolation and installs the dependencies into a new venv, about a minute or two on
2 cores): `.ci/run` runs it as its own step, `pytest -m slow tests/packaging` by hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], timeout: float, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # sdist first, then the wheel built from the unpacked sdist (build's default): proves the sdist suffices
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], timeout=600)
    return out


def test_twine_accepts_sdist_and_wheel(dist: Path):
    files = sorted(dist.iterdir())
    assert sorted(f.suffix for f in files) == [".gz", ".whl"], files
    out = run([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)], timeout=120)
    assert out.count("PASSED") == 2, out


def test_sdist_has_the_sources_to_rebuild(dist: Path):
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("pyproject.toml", "setup.py", "MANIFEST.in", "constraints.txt", "protos/generate.py",
                   "protos/grpc_service.proto", "protos/model_config.proto", "protos/health.proto",
                   "envs/minimal.yml", "worker/compat/triton_python_backend_utils.py", "pytriton/triton.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith("supervisor/_gen/")], "generated modules belong to the build"


def test_wheel_has_generated_modules_and_envs(dist: Path):
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("inferd/supervisor/_gen/grpc_service_pb2.py", "inferd/supervisor/_gen/grpc_service_pb2_grpc.py",
                   "inferd/supervisor/_gen/model_config_pb2.py", "inferd/supervisor/_gen/health_pb2_grpc.py",
                   "inferd/envs/minimal.yml", "inferd/envs/packer.py", "inferd/pytriton/triton.py"):
        assert needed in names, needed
    # pytriton/ is mapped to inferd.pytriton only (setup.py ROOTS), never also packaged inside inferd.worker
    assert not [n for n in names if n.startswith("inferd/worker/pytriton/")]


def test_wheel_in_fresh_venv_serves_http_and_grpc(dist: Path, tmp_path: Path, harness):
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    py = venv / "bin" / "python"
    # the same pinned versions as dev/CI; the wheel's own requirements are ranges
    run([str(py), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), str(wheel)], timeout=600)
    where = run([str(py), "-c", "import inferd.supervisor._gen.grpc_service_pb2 as m; print(m.__file__)"],
                timeout=60, cwd=tmp_path)
    assert where.strip().startswith(str(venv)), where  # the venv's copy, not the checkout's

    http, grpc_port, metrics = harness.free_ports(3)
    log = tmp_path / "server.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [str(venv / "bin" / "inferd"), "--model-repository", str(ROOT / "examples"),
             "--http-port", str(http), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics),
             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
             "--exit-timeout-secs", "10"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, start_new_session=True)
    try:
        harness.wait_for(lambda: harness.http_get(f"http://127.0.0.1:{http}/v2/models/add_sub/ready")[0] == 200
                         or proc.poll() is not None, 120, "add_sub ready")
        assert proc.poll() is None, log.read_text()[-3000:]

        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        a = np.arange(16, dtype=np.float32)
        b = np.full(16, 2.0, dtype=np.float32)
        for module, url in ((httpclient, f"127.0.0.1:{http}"), (grpcclient, f"127.0.0.1:{grpc_port}")):
            client = module.InferenceServerClient(url)
            inputs = [module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
