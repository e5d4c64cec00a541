"""A model's is_ready() in the worker process (worker/readiness.py), driven by a fake supervisor: only a model
that defines it opens the `<identity>/ready` socket (LoadResult.readiness), which greets (seq 0) and answers
each ReadinessProbe with the check's bool or its error, beside a running execute."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from inferd.worker.wire import messages as m

from .workerharness import FakeSupervisor

CONFIG = {"name": "r", "backend": "python", "max_batch_size": 0,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}]}

MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def execute(self, requests):
        if os.path.exists(os.path.join(self.dir, "gate")):  # held until the test writes the FIFO
            with open(os.path.join(self.dir, "gate"), "rb") as fifo:
                fifo.read(1)
        return [pb_utils.InferenceResponse([r.inputs()[0]]) for r in requests]
'''

CHECK = '''
    def is_ready(self):
        answer = open(os.path.join(self.dir, "answer")).read()
        if answer == "raise":
            raise ValueError("no backend")
        if answer == "none":
            return None
        return answer == "yes"
'''


@pytest.fixture
def sup():
    s = FakeSupervisor()
    yield s
    s.close()


def load(sup: FakeSupervisor, tmp_path: Path, source: str) -> tuple[Path, m.LoadResult, list]:
    """Start worker "w" with the model; (model dir, LoadResult, what came on "w/ready" meanwhile)."""
    model_dir = tmp_path / "r"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
    (model_dir / "answer").write_text("yes")
    sup.spawn("w")
    sup.expect(m.Hello)
    sup.send("w", m.LoadModel("r", str(model_dir), "1", json.dumps(CONFIG), "python", "r_0", "CPU", 0))
    ready: list = []
    while True:
        ident, message, _ = sup.recv()
        if ident == "w/ready":
            ready.append(message)
        elif isinstance(message, m.LoadResult):
            return model_dir, message, ready


def readiness_message(sup: FakeSupervisor, seen: list) -> m.ReadinessResult:
    if seen:
        return seen.pop(0)
    ident, message, _ = sup.recv()
    assert ident == "w/ready", (ident, message)
    return message


def test_a_model_with_is_ready_answers_probes(sup, tmp_path):
    model_dir, result, seen = load(sup, tmp_path, MODEL + CHECK)
    assert result.error is None and result.readiness is True
    assert readiness_message(sup, seen) == m.ReadinessResult(0)  # the greeting: the socket is open
    for seq, answer, expected in ((1, "yes", m.ReadinessResult(1, True)), (2, "no", m.ReadinessResult(2, False)),
                                  (3, "raise", m.ReadinessResult(3, False, m.WireError(1, "ValueError: no backend"))),
                                  (4, "none", m.ReadinessResult(4, False, m.WireError(
                                      1, "is_ready() must return a boolean value")))):
        (model_dir / "answer").write_text(answer)
        sup.send("w/ready", m.ReadinessProbe(seq))
        assert readiness_message(sup, seen) == expected
    sup.send("w", m.Shutdown())
    sup.expect(m.Bye)


def test_probes_are_answered_while_execute_runs(sup, tmp_path):
    import os

    model_dir, result, seen = load(sup, tmp_path, MODEL + CHECK)
    assert readiness_message(sup, seen) == m.ReadinessResult(0)
    os.mkfifo(model_dir / "gate")
    data = np.ones(2, np.float32)
    ref = m.TensorRef("X", "FP32", [2], "frame", 0, "", 0, data.nbytes)
    sup.send("w", m.Execute(1, [m.RequestItem(1, "", [ref], ["X"])]), [data.tobytes()])
    sup.send("w/ready", m.ReadinessProbe(1))
    assert readiness_message(sup, seen) == m.ReadinessResult(1, True)  # the execute is still held
    with open(model_dir / "gate", "wb") as fifo:
        fifo.write(b"x")
    sup.expect(m.ExecuteResult)


def test_a_model_without_is_ready_opens_no_socket(sup, tmp_path):
    _, result, seen = load(sup, tmp_path, MODEL)
    assert result.error is None and result.readiness is False
    sup.send("w", m.Shutdown())
    while True:
        ident, message, _ = sup.recv()
        seen.append(ident)
        if isinstance(message, m.Bye):
            break
    assert "w/ready" not in seen


def test_async_is_ready_runs_on_the_models_loop(sup, tmp_path):
    source = MODEL + '''
    async def is_ready(self):
        import asyncio
        await asyncio.sleep(0.01)
        return True
'''
    _, result, seen = load(sup, tmp_path, source)
    assert result.readiness is True
    assert readiness_message(sup, seen) == m.ReadinessResult(0)
    started = time.monotonic()
    sup.send("w/ready", m.ReadinessProbe(9))
    assert readiness_message(sup, seen) == m.ReadinessResult(9, True)
    assert time.monotonic() - started < 5
