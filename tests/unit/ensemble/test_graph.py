"""Ensemble step graphs: what build_plan and check_composing accept and refuse."""

from __future__ import annotations

import pytest
from inferd.supervisor.ensemble.graph import build_plan, check_composing
from inferd.worker.wire.errors import ErrorCode, InferdError


def _t(name: str, dims: list[int], dtype: str = "TYPE_FP32") -> dict:
    return {"name": name, "data_type": dtype, "dims": dims}


def _step(model: str, inputs: dict, outputs: dict, version: int = -1) -> dict:
    return {"model_name": model, "model_version": str(version), "input_map": inputs, "output_map": outputs}


def _ensemble(steps: list[dict], inputs=("A",), outputs=("S",), max_batch_size: int = 0) -> dict:
    return {"name": "ens", "platform": "ensemble", "max_batch_size": max_batch_size,
            "input": [_t(n, [4]) for n in inputs], "output": [_t(n, [4]) for n in outputs],
            "ensemble_scheduling": {"step": steps}}


ADD = {"name": "add", "max_batch_size": 0, "input": [_t("X", [4])], "output": [_t("Y", [4])]}


def _refused(fn, *args) -> str:
    with pytest.raises(InferdError) as info:
        fn(*args)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


def test_a_chain_plans_with_its_consumers():
    plan = build_plan(_ensemble([_step("add", {"X": "A"}, {"Y": "t"}), _step("add", {"X": "t"}, {"Y": "S"})]))
    assert [s.model_name for s in plan.steps] == ["add", "add"]
    assert plan.consumers == {"A": (0,), "t": (1,)}
    assert plan.composing_models == ["add"]
    check_composing(plan, _ensemble([]), lambda name, version: ADD)


def test_a_tensor_written_twice_is_refused():
    msg = _refused(build_plan, _ensemble([_step("add", {"X": "A"}, {"Y": "S"}), _step("add", {"X": "A"}, {"Y": "S"})]))
    assert "ensemble tensor 'S' can appear in an output map only once" in msg


def test_writing_an_ensemble_input_is_refused():
    msg = _refused(build_plan, _ensemble([_step("add", {"X": "A"}, {"Y": "A"}), _step("add", {"X": "A"}, {"Y": "S"})]))
    assert "'A' can appear in an output map only once" in msg


def test_a_tensor_nobody_writes_is_named():
    steps = [_step("add", {"X": "A"}, {"Y": "S"}), _step("add", {"X": "ghost"}, {"Y": "u"})]
    msg = _refused(build_plan, _ensemble(steps))
    assert "'ghost'" in msg and "neither an ensemble input nor written by any step" in msg


def test_a_cycle_off_the_output_path_is_refused():
    steps = [_step("add", {"X": "A"}, {"Y": "S"}), _step("add", {"X": "p"}, {"Y": "q"}),
             _step("add", {"X": "q"}, {"Y": "p"})]
    msg = _refused(build_plan, _ensemble(steps))
    assert "can never run" in msg and "is not connected" in msg


def test_no_steps_is_refused():
    assert "one or more 'step's" in _refused(build_plan, _ensemble([]))


def test_unknown_model_version_is_not_available():
    plan = build_plan(_ensemble([_step("add", {"X": "A"}, {"Y": "S"}, version=3)]))
    msg = _refused(check_composing, plan, _ensemble([]), lambda name, version: None if version == 3 else ADD)
    assert "contains models that are not available or ambiguous: add" in msg


def test_unmapped_required_input_is_refused():
    two = dict(ADD, input=[_t("X", [4]), _t("Z", [4])])
    plan = build_plan(_ensemble([_step("add", {"X": "A"}, {"Y": "S"})]))
    msg = _refused(check_composing, plan, _ensemble([]), lambda name, version: two)
    assert "input Z of model add" in msg


def test_a_batching_ensemble_needs_batching_steps():
    plan = build_plan(_ensemble([_step("add", {"X": "A"}, {"Y": "S"})], max_batch_size=8))
    msg = _refused(check_composing, plan, _ensemble([], max_batch_size=8),
                   lambda name, version: dict(ADD, max_batch_size=4))
    assert "only allows maximum batch size to be 4" in msg
    check_composing(plan, _ensemble([], max_batch_size=8), lambda name, version: dict(ADD, max_batch_size=8))


def test_non_batching_ensemble_may_feed_a_batching_model_with_an_explicit_batch_dim():
    ens = _ensemble([_step("add", {"X": "A"}, {"Y": "S"})])
    ens["input"] = [_t("A", [1, 4])]
    ens["output"] = [_t("S", [1, 4])]
    check_composing(build_plan(ens), ens, lambda name, version: dict(ADD, max_batch_size=8))
    ens["input"] = [_t("A", [4])]
    msg = _refused(check_composing, build_plan(ens), ens, lambda name, version: dict(ADD, max_batch_size=8))
    assert "inconsistent shape: [4] is inferred from model ens while [-1,4] is inferred from model add" in msg
