"""Workers run with a Python path holding the worker package only: model code that reaches for the
supervisor fails to import it (even though the server's interpreter has it installed)."""

from __future__ import annotations

import pytest
from inferd.worker.wire.errors import InferdError

from .harness import request, write_model

IMPORT_AT_INIT = '''
class TritonPythonModel:
    def initialize(self, args):
        import inferd.supervisor.config  # noqa: F401
'''

IMPORT_AT_EXECUTE = '''
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            try:
                import inferd.supervisor  # noqa: F401
                verdict = "imported"
            except ImportError as exc:
                verdict = type(exc).__name__
            paths = [p for p in sys.path if "site-packages" not in p and "python3" not in p]
            assert not any(p.endswith("/supervisor") for p in paths), paths
            if verdict != "ModuleNotFoundError":
                raise RuntimeError(verdict)
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PID", np.array([0], dtype=np.int64))]))
        return out
'''


async def test_import_in_initialize_fails_the_load(env):
    inst = env.instance(write_model(env.models, "sneaky", IMPORT_AT_INIT))
    with pytest.raises(InferdError, match="inferd.supervisor") as info:
        await inst.start()
    assert "ModuleNotFoundError" in info.value.message or "No module named" in info.value.message
    assert inst.pid is None


async def test_import_in_execute_is_refused(env):
    inst = env.instance(write_model(env.models, "curious", IMPORT_AT_EXECUTE))
    await inst.start()
    result = await inst.execute([request("curious", [1.0])])
    assert not isinstance(result.responses[0], InferdError), result.responses[0]
