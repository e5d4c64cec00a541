"""A worker told to forget "cuda:<hex>" (a client's CUDA shm region was unregistered) closes that handle, and
on a CPU-only worker that never opened one nothing CUDA is loaded. The runtime is tests/fake_cuda.py's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from inferd.worker.tensors import ShmCache
from inferd.worker.wire import cuda_ipc

sys.path.insert(0, str(Path(__file__).parents[2]))
import fake_cuda  # noqa: E402  (tests/fake_cuda.py)


def test_forget_closes_client_handles_only_when_open(monkeypatch) -> None:
    monkeypatch.setattr(cuda_ipc, "_runtime", None)
    monkeypatch.setattr(cuda_ipc, "_opened", {})
    cache = ShmCache()
    cache.forget(["cuda:" + "ab" * 64, "cuda:not-hex", "inferd_1_2"])  # nothing open: nothing happens
    assert cuda_ipc._runtime is None, "forgetting must not load a CUDA library"

    monkeypatch.setattr(cuda_ipc, "_runtime", fake_cuda.ShmCuda())
    name = "%sclient%d_forget" % (fake_cuda.PREFIX, os.getpid())
    path = Path("/dev/shm") / name
    path.write_bytes(bytes(64))
    try:
        handle = name.encode().ljust(cuda_ipc.HANDLE_BYTES, b"\0")
        cuda_ipc.open_handle(handle, 0)
        other = "%sclient%d_other" % (fake_cuda.PREFIX, os.getpid())
        (Path("/dev/shm") / other).write_bytes(bytes(64))
        kept = other.encode().ljust(cuda_ipc.HANDLE_BYTES, b"\0")
        cuda_ipc.open_handle(kept, 0)
        cache.forget(["cuda:" + handle.hex()])
        assert handle not in cuda_ipc._opened and kept in cuda_ipc._opened
    finally:
        path.unlink(missing_ok=True)
        (Path("/dev/shm") / ("%sclient%d_other" % (fake_cuda.PREFIX, os.getpid()))).unlink(missing_ok=True)
