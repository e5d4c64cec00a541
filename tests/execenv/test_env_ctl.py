"""`infer-ctl env check|list|prune` on real tarballs (no server involved)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .helpers import write_tar

CTL = [os.path.join(os.path.dirname(sys.executable), "infer-ctl")]


def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTL, *args], capture_output=True, text=True, timeout=120)


def test_env_check_good_tarball(condapack_env: dict[str, Any]) -> None:
    proc = _ctl("env", "check", condapack_env["tarball"], "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["python"].startswith("3.10.") and doc["numpy"].startswith("2.2.")
    assert doc["pyzmq"] and doc["wire_version"] >= 1


def test_env_check_bad_tarballs(tmp_path: Path, condapack_env: dict[str, Any]) -> None:
    truncated = tmp_path / "t.tar.gz"
    with open(condapack_env["tarball"], "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    proc = _ctl("env", "check", str(truncated))  # the table view
    assert proc.returncode == 1 and "corrupt or truncated" in proc.stderr
    escaping = write_tar(tmp_path / "e.tar.gz", [("bin/python", {"data": b"", "mode": 0o755}),
                                                 ("../escape", {"data": b"x"})])
    proc = _ctl("env", "check", str(escaping), "--json")
    assert proc.returncode == 1 and "leaves the environment" in json.loads(proc.stdout)["error"]
    assert not (tmp_path.parent / "escape").exists()


def test_env_list_and_prune(tmp_path: Path, condapack_env: dict[str, Any]) -> None:
    from inferd.supervisor.envs import EnvironmentManager

    cache = tmp_path / "cache"
    mgr = EnvironmentManager(str(cache))
    env = mgr.resolve_sync(condapack_env["tarball"])
    mgr.close()
    listed = json.loads(_ctl("env", "list", "--cache-dir", str(cache), "--json").stdout)
    assert [e["key"] for e in listed["environments"]] == [env.key]
    assert listed["environments"][0]["python"].startswith("3.10.")
    assert "3.10." in _ctl("env", "list", "--cache-dir", str(cache)).stdout
    pruned = json.loads(_ctl("env", "prune", "--cache-dir", str(cache), "--json").stdout)
    assert pruned["removed"] == [env.key] and not os.path.exists(env.root)
