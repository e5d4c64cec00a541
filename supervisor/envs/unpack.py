"""An unpacked environment: its root, relocation (conda-unpack) and a probe of its Python (the extraction
itself is extract.py's).

Every function here is blocking: the manager runs them in its bounded executor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping

from .errors import EnvError
from .extract import Limits, extract_safely

__all__ = ["EnvError", "Limits", "extract_safely", "find_root", "base_env", "env_python", "conda_unpack", "probe",
           "tree_bytes", "remove_tree"]

MIN_PYTHON = (3, 9)

# Runs on the environment's interpreter (any CPython >= 3.x): keep it free of f-strings and 3.9+ syntax.
PROBE = r"""
import json, sys
out = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "version_info": list(sys.version_info[:3]),
       "implementation": sys.implementation.name, "executable": sys.executable, "prefix": sys.prefix}
for mod, key in (("numpy", "numpy"), ("zmq", "pyzmq")):
    try:
        m = __import__(mod)
        out[key] = getattr(m, "__version__", "?")
    except BaseException as exc:
        out[key] = None
        out[key + "_error"] = "%s: %s" % (type(exc).__name__, exc)
sys.stdout.write(json.dumps(out))
"""


def find_root(extracted: str) -> str:
    """The env root inside an extraction dir: itself, or its single top-level folder (`--arcroot`)."""
    if os.path.exists(os.path.join(extracted, "bin", "python")) or os.path.islink(
            os.path.join(extracted, "bin", "python")):
        return extracted
    entries = [e for e in os.listdir(extracted) if not e.startswith(".")]
    if len(entries) == 1:
        sub = os.path.join(extracted, entries[0])
        if os.path.isdir(sub) and os.path.lexists(os.path.join(sub, "bin", "python")):
            return sub
    return extracted


def base_env(env_root: str, inherited: Mapping[str, str]) -> dict[str, str]:
    """A clean environment for running the env's interpreter (no PYTHON*/CONDA_*, env/bin first)."""
    env = {k: v for k, v in inherited.items()
           if not k.startswith(("PYTHON", "CONDA_")) and k not in ("VIRTUAL_ENV", "__PYVENV_LAUNCHER__")}
    env["PATH"] = os.pathsep.join([os.path.join(env_root, "bin"), env.get("PATH", os.defpath)])
    env["CONDA_PREFIX"] = env_root
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def env_python(env_root: str, what: str) -> str:
    python = os.path.join(env_root, "bin", "python")
    if not os.path.lexists(python):
        raise EnvError("environment %s has no bin/python" % what)
    if not os.access(python, os.X_OK):
        raise EnvError("environment %s: bin/python is not executable (or is a dangling link)" % what)
    return python


def _tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def conda_unpack(env_root: str, what: str, inherited: Mapping[str, str], timeout_s: float) -> bool:
    """Run `bin/conda-unpack` once, in place (it rewrites prefixes relative to its own location).
    Returns False when the env has none (not a conda-pack tarball: nothing to relocate)."""
    script = os.path.join(env_root, "bin", "conda-unpack")
    if not os.path.exists(script):
        return False
    python = env_python(env_root, what)
    try:
        proc = subprocess.run([python, script], cwd=env_root, env=base_env(env_root, inherited),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise EnvError("conda-unpack of environment %s did not finish within %.0fs" % (what, timeout_s)) from None
    except OSError as exc:
        raise EnvError("conda-unpack of environment %s could not start: %s" % (what, exc)) from None
    if proc.returncode != 0:
        raise EnvError("conda-unpack of environment %s failed (exit status %d): %s"
                       % (what, proc.returncode, _tail(proc.stderr or proc.stdout)))
    return True


def probe(env_root: str, what: str, inherited: Mapping[str, str], timeout_s: float) -> dict[str, object]:
    """Run the env's python once: its version and numpy/pyzmq versions. EnvError when unusable."""
    python = env_python(env_root, what)
    try:
        proc = subprocess.run([python, "-s", "-c", PROBE], cwd=env_root, env=base_env(env_root, inherited),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise EnvError("the python of environment %s did not answer within %.0fs" % (what, timeout_s)) from None
    except OSError as exc:
        raise EnvError("the python of environment %s cannot run: %s" % (what, exc)) from None
    try:
        info = json.loads(proc.stdout)
        if proc.returncode != 0 or not isinstance(info, dict):
            raise ValueError
    except ValueError:
        raise EnvError("the python of environment %s cannot run (exit status %d): %s"
                       % (what, proc.returncode, _tail(proc.stderr or proc.stdout))) from None
    version = tuple(info.get("version_info") or ())
    if info.get("implementation") != "cpython":
        raise EnvError("environment %s runs %s; inferd workers need CPython" % (what, info.get("implementation")))
    if version < MIN_PYTHON:
        raise EnvError("environment %s has Python %s; inferd workers need Python >= %d.%d"
                       % (what, info.get("python"), *MIN_PYTHON))
    missing = [key for key in ("numpy", "pyzmq") if not info.get(key)]
    if missing:
        detail = "; ".join("%s: %s" % (k, info.get(k + "_error", "not importable")) for k in missing)
        raise EnvError("environment %s (Python %s) lacks %s, which inferd workers need (%s)"
                       % (what, info.get("python"), " and ".join(missing), detail))
    return info


def tree_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
