"""PythonBackend in-process: import rules, return rules and their Triton error texts, async execute."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from inferd.worker.backends import create
from inferd.worker.backends.base import ModelSpec, Request, Tensor, WorkerContext
from inferd.worker.wire.errors import ErrorCode, InferdError

CONFIG = {
    "name": "m", "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
}

HEADER = "import numpy as np\nimport triton_python_backend_utils as pb_utils\n"


def model(tmp_path: Path, body: str, name: str = "m", config: dict | None = None) -> ModelSpec:
    model_dir = tmp_path / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(HEADER + textwrap.dedent(body))
    cfg = dict(config or CONFIG, name=name)
    return ModelSpec(name, str(model_dir), "1", json.dumps(cfg), "python", name + "_0_0", "CPU", 0)


def loaded(spec: ModelSpec):
    backend = create("python")
    backend.load(spec, WorkerContext())
    return backend


def req(i: int = 1, x=(1.0, 2.0), requested=None) -> Request:
    return Request(i, "r%d" % i, [Tensor("X", "FP32", np.array(x, np.float32))], requested or [])


ECHO = """
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy() + %s)])
                for r in requests]
"""


def test_two_models_named_model_py_do_not_clash(tmp_path):
    a = loaded(model(tmp_path, ECHO % "1", "a"))
    b = loaded(model(tmp_path, ECHO % "100", "b"))
    assert a.execute([req()])[0].outputs[0].array.tolist() == [2, 3]
    assert b.execute([req()])[0].outputs[0].array.tolist() == [101, 102]


@pytest.mark.parametrize(
    "returned,message",
    [
        ("{}", "Expected a list in the execute return, found type '<class 'dict'>'."),
        ("[]", "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
               "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:0\n"),
        ("[1, 2]", "Expected an 'InferenceResponse' object in the execute function return list, "
                   "found type '<class 'int'>'."),
    ],
)
def test_return_rules(tmp_path, returned, message):
    backend = loaded(model(tmp_path, "class TritonPythonModel:\n    def execute(self, requests):\n"
                                     "        return %s\n" % returned))
    responses = backend.execute([req(1), req(2)])
    for r in responses:
        assert r.error is not None and r.error.code == ErrorCode.INTERNAL
        assert r.error.message == "Failed to process the request(s) for model 'm_0_0', message: " + message


def test_exception_text_and_model_exception(tmp_path):
    backend = loaded(model(tmp_path, """
        class TritonPythonModel:
            def execute(self, requests):
                raise pb_utils.TritonModelException("custom")
    """))
    [r] = backend.execute([req()])
    assert r.error.message == (
        "Failed to process the request(s) for model 'm_0_0', message: TritonModelException: custom")


def test_async_execute_and_sender(tmp_path):
    backend = loaded(model(tmp_path, """
        import asyncio

        class TritonPythonModel:
            async def initialize(self, args):
                self.offset = 10

            async def execute(self, requests):
                await asyncio.sleep(0)
                out = []
                for i, r in enumerate(requests):
                    resp = pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy() + self.offset)])
                    if i == 0:  # send through the response sender, return None in its place
                        r.get_response_sender().send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        out.append(None)
                    else:
                        out.append(resp)
                return out
    """))
    first, second = backend.execute([req(1), req(2)])
    assert first.outputs[0].array.tolist() == [11, 12] and second.outputs[0].array.tolist() == [11, 12]
    assert backend.unload() is None


def test_requested_outputs_and_pruning(tmp_path):
    backend = loaded(model(tmp_path, """
        class TritonPythonModel:
            def execute(self, requests):
                seen = [r.requested_output_names() for r in requests]
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float32)),
                                                    pb_utils.Tensor("EXTRA", np.zeros(1, np.float32))],
                                                   parameters={"seen": ",".join(s)})
                        for s in seen]
    """))
    r = backend.execute([req(1), req(2, requested=["EXTRA"])])
    assert [t.name for t in r[0].outputs] == ["Y"] and r[0].parameters == {"seen": "Y"}
    assert [t.name for t in r[1].outputs] == ["EXTRA"]


def test_load_errors(tmp_path):
    spec = model(tmp_path, ECHO % "0")
    (Path(spec.model_dir) / "1" / "model.py").unlink()
    with pytest.raises(InferdError) as err:
        loaded(spec)
    assert err.value.code == ErrorCode.NOT_FOUND and "Python model file not found" in err.value.message

    spec = model(tmp_path, "import does_not_exist\n", "imp")
    with pytest.raises(InferdError) as err:
        loaded(spec)
    assert err.value.message == "ModuleNotFoundError: No module named 'does_not_exist'"

    spec = model(tmp_path, "X = 1\n", "nocls")
    with pytest.raises(InferdError, match="TritonPythonModel"):
        loaded(spec)

    spec = model(tmp_path, ECHO % "0", "dec", dict(CONFIG, model_transaction_policy={"decoupled": True}))
    with pytest.raises(InferdError) as err:
        loaded(spec)
    assert err.value.code == ErrorCode.UNSUPPORTED


def test_auto_complete(tmp_path):
    spec = model(tmp_path, """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.set_max_batch_size(4)
                config.set_dynamic_batching()
                return config
            def execute(self, requests):
                return []
    """)
    completed = create("python").auto_complete(spec, dict(spec.config))
    assert completed["max_batch_size"] == 4 and completed["dynamic_batching"] == {}

    spec = model(tmp_path, """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                return None
    """, "none")
    with pytest.raises(InferdError, match="must return a valid pb.ModelConfig object"):
        create("python").auto_complete(spec, dict(spec.config))

    spec = model(tmp_path, """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.set_max_batch_size(-1)
                return config
    """, "bad", dict(CONFIG, max_batch_size=8))
    with pytest.raises(InferdError, match="ValueError: configuration specified max_batch_size 8"):
        create("python").auto_complete(spec, dict(spec.config))


def test_finalize_error_is_reported(tmp_path):
    backend = loaded(model(tmp_path, """
        class TritonPythonModel:
            def execute(self, requests):
                return []
            def finalize(self):
                raise RuntimeError("cleanup failed")
    """))
    err = backend.unload()
    assert err is not None and err.message == "RuntimeError: cleanup failed"


def test_unknown_backend():
    with pytest.raises(InferdError) as err:
        create("tensorflow")
    assert err.value.code == ErrorCode.UNSUPPORTED
