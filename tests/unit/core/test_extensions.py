"""Server metadata advertises an extension only when it works."""

from inferd.supervisor.core.dataplane_impl import TRITON_EXTENSIONS, extensions


def test_cuda_shared_memory_follows_its_capability():
    assert "cuda_shared_memory" not in extensions(cuda_shared_memory=False)
    assert "cuda_shared_memory" in extensions(cuda_shared_memory=True)


def test_trace_only_when_traces_are_written():
    assert "trace" not in extensions(cuda_shared_memory=True)
    assert extensions(cuda_shared_memory=True, trace=True) == list(TRITON_EXTENSIONS)
