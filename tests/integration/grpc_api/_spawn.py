"""Spawning the in-test gRPC server (_server_main.py) in a subprocess, for the fixtures and for tests
that need a server of their own (shutdown)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


PIDS: dict[str, int] = {}  # "host:port" -> the server's pid (the flood tests measure its CPU and RSS)


def serve(kind: str) -> Iterator[str]:
    """Spawns _server_main.py with `kind` ("native", "native-lax" or "grpcio"), yields "host:port", stops it."""
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py")], check=True, cwd=ROOT)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_server_main.py"), kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdin is not None
    found: list[str] = []
    seen: list[str] = []
    ready = threading.Event()

    def pump() -> None:  # reads the log until the start line, then keeps draining it
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            m = re.search(r"Started GRPCInferenceService at (\S+)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(60)
    if not found:
        proc.kill()
        pytest.fail("server did not start:\n" + "".join(seen))
    PIDS[found[0]] = proc.pid
    yield found[0]
    proc.stdin.close()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, "".join(seen)
    assert not any("Traceback" in line for line in seen), "".join(seen)
