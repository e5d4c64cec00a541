"""EXECUTION_ENV_PATH end to end: a real server loads models into a conda-pack CPython 3.10 env."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .helpers import add_report_model, can_unshare, index, infer_info, pyenv_python

pytestmark = pytest.mark.inferd_only


def _load(server: Any, name: str) -> tuple[int, bytes, float]:
    t0 = time.monotonic()
    code, body = server.post(f"/v2/repository/models/{name}/load", b"", timeout=120)
    return code, body, time.monotonic() - t0


def test_model_runs_in_py310_env_shared_and_cached(server_factory: Any, tmp_path: Path,
                                                    condapack_env: dict[str, Any]) -> None:
    tarball = condapack_env["tarball"]
    cache = tmp_path / "envcache"
    repo = tmp_path / "repo"
    repo.mkdir()
    add_report_model(repo, "env_a", tarball)
    add_report_model(repo, "env_b", tarball)
    add_report_model(repo, "plain", None)
    server = server_factory(repo=repo, control_mode="explicit", load_models=["plain"],
                            inferd_args=["--env-cache-dir", str(cache)])
    code, body, first = _load(server, "env_a")
    assert code == 200, body
    info = infer_info(server, "env_a")
    assert info["python"].startswith("3.10."), info
    assert info["numpy"].startswith("2.2."), info
    assert info["pyzmq"] == "27.3.0"
    # the server itself runs another interpreter and numpy
    assert sys.version_info[:2] == (3, 11) and np.__version__.startswith("2.4")
    plain = infer_info(server, "plain")
    assert plain["python"].startswith("3.11.") and plain["numpy"] == np.__version__
    root = Path(info["prefix"])
    assert root.parent == cache and (cache / (root.name + ".ready.json")).exists()
    marker = json.loads((cache / (root.name + ".ready.json")).read_text())
    assert marker["python"] == info["python"] and marker["numpy"] == info["numpy"]

    code, body, second = _load(server, "env_b")  # same tarball: shares the unpacked copy
    assert code == 200, body
    assert infer_info(server, "env_b")["prefix"] == str(root)
    envs = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert envs == [root]
    assert not list((cache / ".tmp").iterdir())
    for pid in server.worker_pids("env_a") + server.worker_pids("env_b"):
        assert os.readlink(f"/proc/{pid}/exe").startswith(str(root) + "/")

    assert server.post("/v2/repository/models/env_a/unload", b"")[0] == 200
    code, body, again = _load(server, "env_a")
    assert code == 200, body
    assert again < 1.5, f"cached load took {again:.2f}s (first {first:.2f}s)"
    assert first > again


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m to hide the base Python")
def test_env_works_with_build_prefix_and_base_python_hidden(server_factory: Any, harness: Any, tmp_path: Path,
                                                            condapack_env: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Relocation: the prefix the env was built in is gone (renamed away by the packer and removed)
    and the pyenv install it was copied from is hidden under an empty tmpfs in the server's mount
    namespace; the env still runs a worker."""
    assert not os.path.exists(condapack_env["built_from"])
    base = condapack_env["base_prefix"]
    original = harness._server_argv

    def hidden(*args: Any, **kw: Any) -> list[str]:
        argv = original(*args, **kw)
        return ["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', base, *argv]

    monkeypatch.setattr(harness, "_server_argv", hidden)
    repo = tmp_path / "repo"
    repo.mkdir()
    add_report_model(repo, "env_hidden", condapack_env["tarball"])
    server = server_factory(repo=repo, wait_ready=["env_hidden"], inferd_args=["--env-cache-dir", str(tmp_path / "c")])
    info = infer_info(server, "env_hidden")
    assert info["python"].startswith("3.10.") and info["numpy"].startswith("2.2.")
    assert not info["executable"].startswith(base)


def _bad_tarballs(tmp: Path, good: str) -> dict[str, tuple[Path, str]]:
    """model name -> (env path, words the UNAVAILABLE reason must contain)."""
    from .helpers import venv_without, wrapper_python_tarball, write_tar

    out: dict[str, tuple[Path, str]] = {}
    out["missing"] = (tmp / "does-not-exist.tar.gz", "does not exist")
    corrupt = tmp / "corrupt.tar.gz"
    corrupt.write_bytes(os.urandom(4096))
    out["corrupt"] = (corrupt, "corrupt or truncated")
    truncated = tmp / "truncated.tar.gz"
    with open(good, "rb") as f:
        truncated.write_bytes(f.read(os.path.getsize(good) // 2))
    out["truncated"] = (truncated, "corrupt or truncated")
    py310 = pyenv_python("3.10.*", "python3.10")
    out["venvpack"] = (write_tar(tmp / "venvpack.tar.gz", [
        ("pyvenv.cfg", {"data": b"home = /usr/bin\n"}),
        ("bin/python", {"type": tarfile.SYMTYPE, "linkname": py310 or "/usr/bin/python3"}),
    ]), "venv-pack")
    out["nobin"] = (write_tar(tmp / "nobin.tar.gz", [("lib/x.txt", {"data": b"x"})]), "no bin/python")
    failing_unpack = "import sys\nsys.stderr.write('cannot rewrite the prefix in lib/libbroken.so\\n')\nsys.exit(3)\n"
    out["unpackfail"] = (wrapper_python_tarball(tmp / "unpackfail.tar.gz", py310 or "/bin/false", failing_unpack),
                         "conda-unpack")
    py38 = pyenv_python("3.8.*", "python3.8")
    if py38:
        d = tmp / "py38env" / "bin"
        d.mkdir(parents=True)
        (d / "python").symlink_to(py38)
        out["oldpython"] = (d.parent, "Python 3.8")
    py39 = pyenv_python("3.9.*", "python3.9")
    if py39:
        d = tmp / "py39bare" / "bin"
        d.mkdir(parents=True)
        (d / "python").symlink_to(py39)
        out["nonumpy"] = (d.parent, "lacks numpy and pyzmq")
    if py310:
        out["nozmq"] = (venv_without(tmp, py310, ["numpy==2.2.6"]), "lacks pyzmq")
    return out


def test_bad_environments_fail_clearly(server_factory: Any, tmp_path: Path, condapack_env: dict[str, Any]) -> None:
    bad = _bad_tarballs(tmp_path, condapack_env["tarball"])
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, (path, _words) in bad.items():
        param = "$$TRITON_MODEL_DIRECTORY/env" + (".tar.gz" if path.suffix == ".gz" or not path.exists() else "")
        if name == "missing":
            add_report_model(repo, name, path, env_param="$$TRITON_MODEL_DIRECTORY/missing.tar.gz")
        else:
            add_report_model(repo, name, path, env_param=param)
    add_report_model(repo, "plain", None)
    server = server_factory(repo=repo, wait_ready=["plain"], inferd_args=["--env-cache-dir", str(tmp_path / "c")])
    rows = server.wait_until(lambda: (lambda r: r if all(n in r and r[n].get("state") for n in bad) else None)(
        index(server)), 60, "all models settled")
    for name, (_path, words) in bad.items():
        row = rows[name]
        assert row["state"] == "UNAVAILABLE", row
        assert words in row["reason"], (name, row["reason"])
    assert rows["plain"]["state"] == "READY"
    assert infer_info(server, "plain")["python"].startswith("3.11.")
    assert server.is_live()


def test_malicious_tarballs_write_nothing_outside_cache(server_factory: Any, tmp_path: Path) -> None:
    from .helpers import write_tar

    outside = tmp_path / "outside"
    outside.mkdir()
    victim_abs = outside / "abs-victim"
    cases = {
        "traversal": ([("bin/python", {"data": b"", "mode": 0o755}),
                       ("../../../../../../.." + str(outside / "dotdot-victim"), {"data": b"pwned"})], "'..'"),
        "absolute": ([("bin/python", {"data": b"", "mode": 0o755}),
                      (str(victim_abs), {"data": b"pwned"})], "absolute"),
        "symlink": ([("bin/python", {"data": b"", "mode": 0o755}),
                     ("lib", {"type": tarfile.SYMTYPE, "linkname": str(outside)}),
                     ("lib/link-victim", {"data": b"pwned"})], "absolute"),
        "relsymlink": ([("bin/python", {"data": b"", "mode": 0o755}),
                        ("share", {"type": tarfile.SYMTYPE, "linkname": "../../../../../../../" + str(outside)}),
                        ("share/rel-victim", {"data": b"pwned"})], "leaves the environment"),
        "hardlink": ([("bin/python", {"data": b"", "mode": 0o755}),
                      ("etc/passwd", {"type": tarfile.LNKTYPE, "linkname": "../../../../etc/passwd"})],
                     "leaves the environment"),
        "device": ([("bin/python", {"data": b"", "mode": 0o755}),
                    ("dev/sda", {"type": tarfile.BLKTYPE, "devmajor": 8, "devminor": 0})], "device"),
    }
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, (members, _w) in cases.items():
        add_report_model(repo, name, write_tar(tmp_path / f"{name}.tar.gz", members))
    cache = tmp_path / "c"
    server = server_factory(repo=repo, wait_ready=[], inferd_args=["--env-cache-dir", str(cache)])
    rows = server.wait_until(lambda: (lambda r: r if all(r.get(n, {}).get("state") for n in cases) else None)(
        index(server)), 60, "all models settled")
    for name, (_m, words) in cases.items():
        assert rows[name]["state"] == "UNAVAILABLE" and words in rows[name]["reason"], (name, rows[name])
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [".tmp"]
    assert list((cache / ".tmp").iterdir()) == []


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m to mount a small tmpfs")
def test_full_disk_during_unpack(server_factory: Any, harness: Any, tmp_path: Path, condapack_env: dict[str, Any],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "small"
    cache.mkdir()
    original = harness._server_argv

    def small_cache(*args: Any, **kw: Any) -> list[str]:
        return ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=8m tmpfs "$0" && exec "$@"', str(cache),
                *original(*args, **kw)]

    monkeypatch.setattr(harness, "_server_argv", small_cache)
    repo = tmp_path / "repo"
    repo.mkdir()
    add_report_model(repo, "full", condapack_env["tarball"])
    add_report_model(repo, "plain", None)
    server = server_factory(repo=repo, wait_ready=["plain"], inferd_args=["--env-cache-dir", str(cache)])
    row = server.wait_until(lambda: index(server).get("full", {}).get("state") == "UNAVAILABLE"
                            and index(server)["full"], 60, "full settled")
    assert "no space left on device" in row["reason"], row
    assert infer_info(server, "plain")["python"].startswith("3.11.")
