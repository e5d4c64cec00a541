"""Generate the Python protobuf/gRPC modules into supervisor/_gen (package inferd.supervisor._gen).

Run as `.venv/bin/python protos/generate.py [--force]`. Idempotent: it does nothing when every
output is newer than the .proto files and this script, and it only rewrites files whose content
changed, so editable installs and running servers are not disturbed needlessly.

protoc emits flat imports (`import model_config_pb2`) that only work with the output folder on
sys.path; we rewrite them to absolute imports inside the inferd namespace.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "supervisor" / "_gen"
PACKAGE = "inferd.supervisor._gen"
PROTOS = ("model_config.proto", "grpc_service.proto", "health.proto")
_GRPC = ("grpc_service.proto", "health.proto")  # files that define services

INIT_TEXT = '"""Generated protobuf modules (protos/generate.py); not in git."""\n'


def _outputs() -> list[Path]:
    outs = [OUT_DIR / "__init__.py"]
    for proto in PROTOS:
        stem = proto[: -len(".proto")]
        outs += [OUT_DIR / f"{stem}_pb2.py", OUT_DIR / f"{stem}_pb2.pyi"]
        if proto in _GRPC:
            outs.append(OUT_DIR / f"{stem}_pb2_grpc.py")
    return outs


def _up_to_date() -> bool:
    inputs = [PROTO_DIR / p for p in PROTOS] + [Path(__file__).resolve()]
    newest_input = max(p.stat().st_mtime for p in inputs)
    try:
        return all(p.stat().st_mtime >= newest_input for p in _outputs())
    except FileNotFoundError:
        return False


def _fix_imports(text: str, modules: set[str]) -> str:
    # `import x_pb2 as y` -> `from inferd.supervisor._gen import x_pb2 as y` for our own modules only
    def repl(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in modules:
            return m.group(0)
        return f"{m.group(1)}from {PACKAGE} import {name}{m.group(3)}"

    return re.sub(r"^(\s*)import (\w+_pb2)(\b.*)$", repl, text, flags=re.MULTILINE)


def _write_if_changed(path: Path, text: str) -> bool:
    try:
        if path.read_text() == text:
            os.utime(path)  # mark fresh so the fast path applies next time
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def generate(force: bool = False) -> int:
    if not force and _up_to_date():
        return 0
    import grpc_tools
    from grpc_tools import protoc

    wkt = Path(grpc_tools.__file__).parent / "_proto"  # well-known types, should a proto need them
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    modules = {p[: -len(".proto")] + "_pb2" for p in PROTOS}
    changed = 0
    with tempfile.TemporaryDirectory(prefix="inferd-protoc-") as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{wkt}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(PROTO_DIR / p) for p in PROTOS],
        ]
        rc = protoc.main(args)
        if rc != 0:
            print(f"protoc failed with exit status {rc}", file=sys.stderr)
            return rc
        for src in sorted(Path(tmp).iterdir()):
            if src.suffix not in (".py", ".pyi"):
                continue
            # protoc writes an empty *_pb2_grpc.py for files without services; keep only the useful
            if src.name.endswith("_pb2_grpc.py") and src.name[: -len("_pb2_grpc.py")] + ".proto" not in _GRPC:
                continue
            changed += _write_if_changed(OUT_DIR / src.name, _fix_imports(src.read_text(), modules))
    changed += _write_if_changed(OUT_DIR / "__init__.py", INIT_TEXT)
    print(f"protos: {changed} file(s) written to {OUT_DIR.relative_to(ROOT)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="regenerate even when up to date")
    return generate(force=parser.parse_args().force)


if __name__ == "__main__":
    sys.exit(main())
