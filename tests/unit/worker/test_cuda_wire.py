"""Device tensor references on the wire (loc "cuda") and cuda_ipc's behaviour where no GPU is."""

import subprocess
import sys

import pytest
from inferd.worker.wire import cuda_ipc, messages
from inferd.worker.wire.messages import ExecuteResult, ResponseItem, TensorRef


def _cuda_ref() -> TensorRef:
    handle = bytes(range(64))
    return TensorRef(name="OUT", datatype="FP32", shape=[2, 3], loc="cuda", region=cuda_ipc.encode_handle(handle),
                     offset=512, nbytes=24, device=1, owner="m_0")


def test_cuda_ref_round_trips_through_execute_result() -> None:
    ref = _cuda_ref()
    frames = messages.encode(ExecuteResult(batch_id=7, responses=[ResponseItem(request_id=3, outputs=[ref])]))
    decoded, _ = messages.decode(frames)
    got = decoded.responses[0].outputs[0]
    assert (got.loc, got.device, got.owner, got.offset, got.nbytes) == ("cuda", 1, "m_0", 512, 24)
    assert cuda_ipc.decode_handle(got.region) == bytes(range(64))


def test_host_refs_keep_defaults_for_device_fields() -> None:
    frames = messages.encode(ExecuteResult(batch_id=1, responses=[ResponseItem(request_id=1, outputs=[
        TensorRef(name="X", datatype="INT8", shape=[1], frame=1, nbytes=1)])]))
    decoded, _ = messages.decode(frames)
    got = decoded.responses[0].outputs[0]
    assert (got.loc, got.device, got.owner) == ("frame", 0, "")


@pytest.mark.parametrize("region", ["zz" * 64, "00" * 63, "00" * 65, ""])
def test_decode_handle_refuses_malformed(region: str) -> None:
    with pytest.raises(cuda_ipc.CudaIpcError):
        cuda_ipc.decode_handle(region)


def test_open_handle_refuses_wrong_size_before_touching_cuda() -> None:
    with pytest.raises(cuda_ipc.CudaIpcError, match="64 bytes"):
        cuda_ipc.open_handle(b"\0" * 10, 0)


def test_without_cuda_every_call_raises_cuda_ipc_error() -> None:
    # A fresh interpreter with no CUDA library importable: available() is False and calls raise
    # CudaIpcError (never crash). Skipped where a GPU runtime is present.
    code = (
        "import sys\n"
        "for name in ('cuda', 'cupy', 'torch', 'nvidia'): sys.modules[name] = None\n"
        "import ctypes\n"
        "real = ctypes.CDLL\n"
        "class NoCuda(real):\n"
        "    def __init__(self, name, *a, **k):\n"
        "        if name and 'cuda' in str(name): raise OSError('hidden: ' + str(name))\n"
        "        real.__init__(self, name, *a, **k)\n"
        "ctypes.CDLL = NoCuda\n"
        "from inferd.worker.wire import cuda_ipc\n"
        "assert cuda_ipc.available() is False\n"
        "for call in (lambda: cuda_ipc.device_count(), lambda: cuda_ipc.open_handle(bytes(64), 0),\n"
        "             lambda: cuda_ipc.export(1, 0), lambda: cuda_ipc.copy(1, 2, 3, 0)):\n"
        "    try:\n"
        "        call()\n"
        "    except cuda_ipc.CudaIpcError as exc:\n"
        "        assert 'no CUDA runtime' in str(exc), exc\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_importing_cuda_ipc_loads_no_cuda_library() -> None:
    code = ("import sys\nfrom inferd.worker.wire import cuda_ipc\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('cuda', 'cupy', 'torch')]\n"
            "assert not bad, bad\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
