"""Helpers for EXECUTION_ENV_PATH tests: a real conda-pack tarball built from a pyenv CPython 3.10
(no conda needed, see envs/packer.py), cached between runs under ~/.cache/inferd-test/condapack keyed
by the recipe's hash; models that report the interpreter they run on; hand-made bad tarballs."""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

ENV_PACKAGES = ["numpy==2.2.6", "pyzmq==27.3.0"]
CACHE = os.environ.get("INFERD_TEST_ENV_CACHE", os.path.expanduser("~/.cache/inferd-test/condapack"))


def pyenv_python(version_glob: str, exe: str) -> str | None:
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", version_glob, "bin", exe)))
    return found[-1] if found else None


REPORT_MODEL = textwrap.dedent('''\
    import json, sys
    import numpy as np
    import zmq
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            info = {"python": "%d.%d.%d" % sys.version_info[:3], "numpy": np.__version__,
                    "pyzmq": zmq.__version__, "prefix": sys.prefix, "executable": sys.executable}
            out = np.array([json.dumps(info).encode()], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)]) for _ in requests]
''')


def report_config(name: str, env_param: str | None) -> str:
    params = ""
    if env_param is not None:
        params = ('parameters: { key: "EXECUTION_ENV_PATH", value: { string_value: "%s" } }\n' % env_param)
    return textwrap.dedent('''\
        name: "%s"
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
        output [ { name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] } ]
        instance_group [ { count: 1, kind: KIND_CPU } ]
        ''') % name + params


def add_report_model(repo: Path, name: str, env: str | Path | None = None,
                     env_param: str = "$$TRITON_MODEL_DIRECTORY/env.tar.gz") -> Path:
    """A model printing its interpreter's versions; `env` (a file or dir) is linked to where the
    EXECUTION_ENV_PATH parameter points inside the model dir."""
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(REPORT_MODEL)
    (d / "config.pbtxt").write_text(report_config(name, env_param if env is not None else None))
    if env is not None:
        target = d / env_param.replace("$$TRITON_MODEL_DIRECTORY/", "")
        if Path(env).exists() or Path(env).is_symlink():
            target.symlink_to(os.path.abspath(env))
    return d


def infer_info(server: Any, name: str) -> dict[str, Any]:
    import json

    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}).encode()
    code, raw = server.post(f"/v2/models/{name}/infer", body, headers={"Content-Type": "application/json"})
    assert code == 200, raw
    return json.loads(json.loads(raw)["outputs"][0]["data"][0])


def index(server: Any) -> dict[str, dict[str, Any]]:
    import json

    code, raw = server.post("/v2/repository/index", b"{}")
    assert code == 200, raw
    return {row["name"]: row for row in json.loads(raw)}


# ---- hand-made tarballs ----
def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644, **kw: Any) -> None:
    info = tarfile.TarInfo(name)
    for key, value in kw.items():
        setattr(info, key, value)
    info.mode = mode
    if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def write_tar(path: Path, members: list[tuple[str, dict[str, Any]]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, kw in members:
            _add(tar, name, **kw)
    return path


def wrapper_python_tarball(path: Path, real_python: str, conda_unpack: str | None = None) -> Path:
    """A tarball whose bin/python is a shell wrapper around `real_python` (plus a conda-unpack)."""
    members: list[tuple[str, dict[str, Any]]] = [
        ("bin", {"type": tarfile.DIRTYPE, "mode": 0o755}),
        ("bin/python", {"data": ('#!/bin/sh\nexec %s "$@"\n' % real_python).encode(), "mode": 0o755}),
        ("conda-meta/history", {"data": b""}),
    ]
    if conda_unpack is not None:
        members.append(("bin/conda-unpack", {"data": conda_unpack.encode(), "mode": 0o755}))
    return write_tar(path, members)


def venv_without(tmp: Path, python: str, packages: list[str]) -> Path:
    """A real venv (uv) on `python` with `packages` installed: an unpacked env dir."""
    from inferd.envs import packer

    uv = packer.find_tool("uv")
    if uv is None:
        pytest.skip("needs uv")
    d = tmp / ("venv-" + "-".join(p.split("=")[0] for p in packages) or "bare")
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([uv, "venv", "-q", "-p", python, str(d)], check=True, env=env)
    if packages:
        subprocess.run([uv, "pip", "install", "-q", "--python", str(d / "bin" / "python"), *packages],
                       check=True, env=env)
    return d


def can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
