"""Ensembles with optional inputs (issue 43 item 10, Triton's qa L0_optional_input): an input the request
leaves out, or an output a step does not produce, is absent; a step runs once each tensor it reads is
present or absent and gets the present ones; an output no step produced is left out of the response.
inferd stalled ("ensemble ... stalled") or failed ("returned no output"). The composing models here are
coroutines; tests/e2e/test_ensemble_optional.py runs the same over real models and Triton."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from inferd.supervisor.ensemble.graph import build_plan
from inferd.supervisor.ensemble.scheduler import EnsembleScheduler
from inferd.supervisor.inference.types import InferRequest, InferResponse, RequestedOutput, Tensor


def _t(name: str) -> dict:
    return {"name": name, "data_type": "TYPE_FP32", "dims": [1], "optional": True}


def _step(inputs: dict, outputs: dict, model: str = "partial") -> dict:
    return {"model_name": model, "model_version": "-1", "input_map": inputs, "output_map": outputs}


def _config(steps: list[dict]) -> dict:
    return {"name": "ens", "platform": "ensemble", "max_batch_size": 0, "input": [_t("INPUT0"), _t("INPUT1")],
            "output": [_t("OUTPUT0"), _t("OUTPUT1")], "ensemble_scheduling": {"step": steps}}


BOTH_IN = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
BOTH_OUT = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
CONNECTING = [_step(BOTH_IN, {"OUTPUT0": "mid0", "OUTPUT1": "mid1"}),
              _step({"INPUT0": "mid0", "INPUT1": "mid1"}, BOTH_OUT)]


class _Stats:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Models:
    """'partial': OUTPUTi = INPUTi for the inputs given, and only those (qa's optional_identity);
    'stream': the same, one response per input given (a decoupled model)."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def _outputs(self, request: InferRequest) -> list[Tensor]:
        self.seen.append(sorted(t.name for t in request.inputs))
        return [Tensor("OUTPUT" + t.name[-1], t.datatype, t.shape, t.data) for t in request.inputs]

    async def call(self, request: InferRequest) -> InferResponse:
        await asyncio.sleep(0)
        return InferResponse(request.model_name, "1", request.id, self._outputs(request))

    async def stream(self, request: InferRequest):
        for out in self._outputs(request):
            yield InferResponse(request.model_name, "1", request.id, [out])
        yield InferResponse(request.model_name, "1", request.id, [])


def _request(*given: str, outputs: tuple[str, ...] = ()) -> InferRequest:
    inputs = [Tensor(n, "FP32", [1], bytes([i + 1, 0, 0, 0])) for i, n in enumerate(given)]
    return InferRequest("ens", inputs=inputs, outputs=[RequestedOutput(n) for n in outputs])


def _run(config: dict, request: InferRequest, decoupled: frozenset[int] = frozenset()) -> tuple[Any, Models]:
    models = Models()
    plan = dataclasses.replace(build_plan(config), decoupled_steps=decoupled)

    async def go() -> Any:
        scheduler = EnsembleScheduler(plan, "1", models.call, models.stream, _Stats())
        if not decoupled:
            return await scheduler.submit(request)
        got: list[Any] = []

        class Sink:
            def put(self, item: Any, final: bool) -> None:
                got.append(item)

        request.response_sink = Sink()
        await scheduler.submit(request)
        return got

    return asyncio.run(asyncio.wait_for(go(), 10)), models


def _names(resp: InferResponse) -> list[str]:
    return sorted(t.name for t in resp.outputs)


def test_a_step_runs_without_the_optional_input_left_out():
    resp, models = _run(_config([_step(BOTH_IN, BOTH_OUT)]), _request("INPUT1"))
    assert models.seen == [["INPUT1"]] and _names(resp) == ["OUTPUT1"]


def test_an_output_no_step_produced_is_left_out_even_when_asked():
    resp, models = _run(_config(CONNECTING), _request("INPUT0", outputs=("OUTPUT0", "OUTPUT1")))
    assert models.seen == [["INPUT0"], ["INPUT0"]]  # the second step waited for the first, then ran without mid1
    assert _names(resp) == ["OUTPUT0"]
    resp, _ = _run(_config(CONNECTING), _request("INPUT0", outputs=("OUTPUT1",)))
    assert resp.outputs == []


def test_every_input_given_still_flows_through():
    resp, models = _run(_config(CONNECTING), _request("INPUT0", "INPUT1"))
    assert models.seen == [["INPUT0", "INPUT1"]] * 2 and _names(resp) == ["OUTPUT0", "OUTPUT1"]


def test_a_decoupled_step_whose_responses_carry_some_outputs():
    """Each response of the decoupled first step holds one output: each branch runs the second step with
    what that response carried (the other tensor absent there)."""
    got, models = _run(_config(CONNECTING), _request("INPUT0", "INPUT1"), decoupled=frozenset({0}))
    branches = [_names(r) for r in got if isinstance(r, InferResponse) and r.outputs]
    assert sorted(branches) == [["OUTPUT0"], ["OUTPUT1"]]
    assert sorted(models.seen[1:]) == [["INPUT0"], ["INPUT1"]]
