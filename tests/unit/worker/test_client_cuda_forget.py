"""A worker told to forget "cuda:<hex>" (a client's CUDA shm region was unregistered) closes that handle, and
on a CPU-only worker that never opened one nothing CUDA is loaded."""

from __future__ import annotations

from inferd.worker.tensors import ShmCache
from inferd.worker.wire import cuda_ipc


def test_forget_closes_client_handles_only_when_open(monkeypatch) -> None:
    closed: list[bytes] = []
    monkeypatch.setattr(cuda_ipc, "_runtime", None)
    cache = ShmCache()
    cache.forget(["cuda:" + "ab" * 64, "cuda:not-hex", "inferd_1_2"])  # nothing open: nothing happens
    assert cuda_ipc._runtime is None, "forgetting must not load a CUDA library"

    class Runtime:  # the few calls close_handle makes, recorded
        def set_device(self, device: int) -> None: ...
        def init_context(self) -> None: ...
        def close(self, ptr: int) -> None:
            closed.append(ptr)

    handle = bytes([7]) * 64
    monkeypatch.setattr(cuda_ipc, "_runtime", Runtime())
    monkeypatch.setitem(cuda_ipc._opened, handle, (0x7000, 0))
    cache.forget(["cuda:" + handle.hex()])
    assert closed == [0x7000] and handle not in cuda_ipc._opened
