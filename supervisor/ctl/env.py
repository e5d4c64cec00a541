"""`infer-ctl env ...`: per-model environments, handled locally (no server needed).

- `env check TARBALL|DIR`: unpack into a temp dir as the server would, relocate, probe, and import the
  worker's own modules with the env's interpreter.
- `env list` / `env prune`: the server's environment cache (--cache-dir, default ~/.cache/inferd/envs).
- `env pack SPEC|--prefix DIR -o OUT`: build a conda-pack tarball (envs/packer.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from . import render
from .client import CtlError

WORKER_IMPORT_CHECK = ("import inferd.worker.wire.messages as m, inferd.worker.wire.shm, triton_python_backend_utils; "
                       "print(m.WIRE_VERSION)")


def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "inferd", "envs")


# The env code (envs/, shared with the server; it imports asyncio): loaded only by `env` commands (fast start).
def _manager_mod() -> Any:
    from ..envs import manager

    return manager


def _emit(args: argparse.Namespace, doc: Any, human: Callable[[], str]) -> None:
    print(json.dumps(doc, indent=2) if args.json else human())


def _mb(n: Any) -> str:
    return "%.1f MB" % (int(n or 0) / 1e6)


def check(path: str) -> dict[str, Any]:
    """Everything `env check` reports; raises CtlError when the env cannot run an inferd worker."""
    from ..envs import EnvError, EnvironmentManager
    from ..envs.unpack import base_env
    from ..envs.worker_pypath import prepare_pypath

    tmp = tempfile.mkdtemp(prefix="inferd-envcheck-")
    try:
        mgr = EnvironmentManager(tmp)
        t0 = time.monotonic()
        try:
            env = mgr.resolve_sync(path)
        except EnvError as exc:
            raise CtlError(exc.message) from None
        finally:
            mgr.close()
        pypath = prepare_pypath(os.path.join(tmp, "run"))
        run_env = base_env(env.root, os.environ)
        run_env["PYTHONPATH"] = pypath
        proc = subprocess.run([env.python, "-s", "-c", WORKER_IMPORT_CHECK], env=run_env, capture_output=True,
                              text=True, timeout=60, cwd=tmp)
        if proc.returncode != 0:
            raise CtlError("environment %s cannot import the inferd worker: %s"
                           % (path, (proc.stderr or proc.stdout).strip()[-800:]))
        info = dict(env.info)
        return {"path": os.path.abspath(path), "ok": True, "python": info.get("python"), "numpy": info.get("numpy"),
                "pyzmq": info.get("pyzmq"), "sha256": info.get("sha256", ""), "unpacked_bytes": info.get("bytes"),
                "wire_version": int(proc.stdout.strip() or 0),
                "seconds": {k: round(v, 3) for k, v in env.seconds.items()} | {
                    "check": round(time.monotonic() - t0, 3)}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_check(args: argparse.Namespace) -> int:
    doc = check(args.path)
    _emit(args, doc, lambda: render.table(["field", "value"], [
        ["environment", doc["path"]], ["python", doc["python"]], ["numpy", doc["numpy"]], ["pyzmq", doc["pyzmq"]],
        ["unpacked", _mb(doc["unpacked_bytes"])], ["worker", "imports (wire v%d)" % doc["wire_version"]],
        ["took", "%.2fs" % doc["seconds"]["check"]]]) + "\nok: this environment can run inferd workers")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    entries = _manager_mod().list_entries(args.cache_dir)
    doc = {"cache_dir": args.cache_dir, "environments": entries,
           "total_bytes": sum(e["bytes"] for e in entries)}

    def human() -> str:
        if not entries:
            return "no environments in %s" % args.cache_dir
        rows = [[e["key"][:12], e["python"], e["numpy"], e["pyzmq"], _mb(e["bytes"]),
                 render.duration(time.time() - e["last_used"]) + " ago", "yes" if e["in_use"] else "",
                 e["source"]] for e in entries]
        return (render.table(["env", "python", "numpy", "pyzmq", "size", "last used", "in use", "source"], rows)
                + "\n%d environment(s), %s in %s" % (len(entries), _mb(doc["total_bytes"]), args.cache_dir))

    _emit(args, doc, human)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    max_bytes = int(args.max_gb * (1 << 30)) if args.max_gb is not None else 0
    removed = _manager_mod().prune(args.cache_dir, max_bytes=max_bytes, recent_s=args.keep_recent)
    left = _manager_mod().list_entries(args.cache_dir)
    doc = {"cache_dir": args.cache_dir, "removed": removed, "kept": [e["key"] for e in left]}
    _emit(args, doc, lambda: "removed %d environment(s), kept %d (in use, recent or within the limit)"
          % (len(removed), len(left)))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from inferd.envs import packer, spec_path

    out = os.path.abspath(args.output)
    t0 = time.monotonic()
    try:
        if args.prefix:
            packer.pack_prefix(args.prefix, out, progress=not args.json)
            doc: dict[str, Any] = {"tarball": out, "from": args.prefix}
        elif args.spec is None:
            raise CtlError("give a spec (name or .yml file) or --prefix CONDA_ENV_DIR")
        elif args.base_python:
            spec = packer.read_spec(spec_path(args.spec))
            _want, reqs = packer.pip_requirements(spec)
            doc = packer.build_from_python(args.base_python, out, reqs,
                                           progress=None if args.json else (lambda s: print(s, file=sys.stderr)))
        else:
            packer.pack_spec(spec_path(args.spec), out, progress=not args.json)
            doc = {"tarball": out, "from": args.spec}
    except packer.PackError as exc:
        raise CtlError(str(exc)) from None
    doc["bytes"] = os.path.getsize(out)
    doc["seconds_total"] = round(time.monotonic() - t0, 2)
    _emit(args, doc, lambda: "packed %s (%s) in %.1fs\nuse it with: parameters: { key: \"EXECUTION_ENV_PATH\", "
          "value: { string_value: \"$$TRITON_MODEL_DIRECTORY/%s\" } }"
          % (out, _mb(doc["bytes"]), doc["seconds_total"], os.path.basename(out)))
    return 0


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser, bool], None]) -> None:
    p = sub.add_parser("env", help="per-model environments: check, list, prune, pack (local, no server)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p, False)
    p.set_defaults(fn=None, local=True)
    env_sub = p.add_subparsers(dest="env_command", metavar="ENV_COMMAND", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        q = env_sub.add_parser(name, help=help_text, description=help_text)
        common(q, False)
        q.set_defaults(env_fn=fn)
        return q

    q = add("check", cmd_check, "unpack an environment tarball (or use a dir) and check it can run inferd workers")
    q.add_argument("path")
    for name, fn, text in (("list", cmd_list, "environments in the server's cache"),
                           ("prune", cmd_prune, "remove cached environments no running worker uses")):
        q = add(name, fn, text)
        q.add_argument("--cache-dir", default=default_cache_dir(), help="default: ~/.cache/inferd/envs")
        if name == "prune":
            q.add_argument("--max-gb", type=float, default=None, help="keep the cache under this size (default: "
                           "remove every environment not in use)")
            q.add_argument("--keep-recent", type=float, default=0.0, metavar="SECONDS",
                           help="also keep environments used this recently (default 0)")
    q = add("pack", cmd_pack, "build a conda-pack tarball from a spec (envs/*.yml) or a conda env prefix")
    q.add_argument("spec", nargs="?", help="bundled spec name (minimal, onnxruntime, torch-cpu) or a .yml file")
    q.add_argument("--prefix", help="pack this existing conda environment instead")
    q.add_argument("--base-python", help="no conda: build from this self-contained CPython (e.g. pyenv's)")
    q.add_argument("-o", "--output", default="env.tar.gz")


def run(args: argparse.Namespace) -> int:
    return int(args.env_fn(args))
