"""The worker's staging PYTHONPATH and environment."""

from __future__ import annotations

import os
import subprocess

from inferd.supervisor.envs.worker_pypath import prepare_pypath, worker_package_dir
from inferd.supervisor.instances.launcher import Launcher, clean_env


def test_pypath_layout(run_dir):
    root = prepare_pypath(run_dir)
    assert root == os.path.join(run_dir, "pypath")
    assert os.path.isfile(os.path.join(root, "inferd", "__init__.py"))
    assert os.readlink(os.path.join(root, "inferd", "worker")) == worker_package_dir()
    assert os.readlink(os.path.join(root, "triton_python_backend_utils.py")) == os.path.join(
        worker_package_dir(), "compat", "triton_python_backend_utils.py")
    assert prepare_pypath(run_dir) == root  # idempotent
    assert sorted(os.listdir(root)) == ["inferd", "triton_python_backend_utils.py"]


def test_clean_env():
    base = {"PATH": "/usr/bin", "HOME": "/root", "PYTHONPATH": "/evil", "PYTHONHOME": "/x",
            "PYTHONSTARTUP": "/y", "CONDA_PREFIX": "/c", "CONDA_DEFAULT_ENV": "c", "LANG": "C.UTF-8"}
    env = clean_env("/run/pypath", base, {"FOO": "1", "PYTHONPATH": "/nope"}, ["/env/bin"])
    assert env["PYTHONPATH"] == "/run/pypath" and env["PYTHONNOUSERSITE"] == "1"
    assert not [k for k in env if k.startswith("CONDA_")]
    assert "PYTHONHOME" not in env and "PYTHONSTARTUP" not in env
    assert env["FOO"] == "1" and env["PATH"] == "/env/bin:/usr/bin" and env["LANG"] == "C.UTF-8"


def run_in_worker_env(launcher: Launcher, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([launcher.python, "-s", "-c", code], env=launcher.env(), capture_output=True,
                          text=True, timeout=60, cwd="/")


def test_worker_env_sees_worker_wire_but_not_supervisor(run_dir):
    launcher = Launcher(run_dir)
    ok = run_in_worker_env(launcher, "import inferd.worker.wire.messages as m, inferd; print(m.WIRE_VERSION)")
    assert ok.returncode == 0, ok.stderr
    bad = run_in_worker_env(launcher, "import inferd.supervisor")
    assert bad.returncode != 0 and "ModuleNotFoundError" in bad.stderr
    bad = run_in_worker_env(launcher, "import inferd.supervisor.config")
    assert bad.returncode != 0 and "ModuleNotFoundError" in bad.stderr
