"""worker/backends/ragged.py: the batch_input values Triton's backends compute, ragged inputs flattened and
concatenated, batch outputs scattered by their source input's shape. Examples are model_config.proto's own
and those of Triton's qa/L0_batch_input."""

from __future__ import annotations

import numpy as np
import pytest
from inferd.worker.backends import ragged
from inferd.worker.backends.base import Request, Tensor
from inferd.worker.backends.ragged import RaggedPlan, batch_input_value
from inferd.worker.wire.errors import ErrorCode, InferdError

F32, I32 = np.float32, np.int32
QA_SHAPES = [(1, 2), (1, 4), (1, 1), (1, 3)]  # L0_batch_input's four requests


@pytest.mark.parametrize("kind, dtype, expected", [
    ("BATCH_ELEMENT_COUNT", F32, [2, 4, 1, 3]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", I32, [2, 6, 7, 10]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", F32, [0, 2, 6, 7, 10]),
])
def test_element_counts_of_the_qa_batch(kind, dtype, expected):
    value = batch_input_value(kind, dtype, QA_SHAPES)
    assert value.dtype == dtype and value.tolist() == expected


def test_element_count_includes_the_batch_dimension():
    # a batch-2 request of [2, 3] holds 6 elements
    assert batch_input_value("BATCH_ELEMENT_COUNT", I32, [(2, 3), (1, 5)]).tolist() == [6, 5]


def test_max_element_count_is_told_by_the_shape():
    value = batch_input_value("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", F32, QA_SHAPES)
    assert value.shape == (4,) and value.dtype == F32


def test_item_shape_examples_of_model_config_proto():
    # "one batch-2 input with shape [3, 1] and batch-1 input with shape [2, 2]" (the request tensors are
    # [2, 3, 1] and [1, 2, 2])
    shapes = [(2, 3, 1), (1, 2, 2)]
    item = batch_input_value("BATCH_ITEM_SHAPE", F32, shapes)
    assert item.shape == (3, 2) and item.tolist() == [[3, 1], [3, 1], [2, 2]]
    flat = batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", I32, shapes)
    assert flat.dtype == I32 and flat.tolist() == [3, 1, 3, 1, 2, 2]


def test_item_shape_of_the_qa_tests():
    assert batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", F32, [(1, 4, 1), (1, 1, 2), (1, 1, 2), (1, 2, 2)]).tolist() \
        == [4, 1, 1, 2, 1, 2, 2, 2]
    assert batch_input_value("BATCH_ITEM_SHAPE", F32, [(2, 1, 2), (1, 1, 2), (1, 2, 2)]).tolist() \
        == [[1, 2], [1, 2], [1, 2], [2, 2]]


def test_item_shape_of_a_rank_one_source_has_no_columns():
    assert batch_input_value("BATCH_ITEM_SHAPE", F32, [(2,), (1,)]).shape == (3, 0)
    with pytest.raises(InferdError):
        batch_input_value("BATCH_ITEM_SHAPE", F32, [()])  # no batch dimension to repeat by


def test_item_shape_rows_beyond_the_elements_are_refused():
    # a non-batching model's source of shape [4e9, 0] is no data and 4e9 rows (a list of them took the worker's
    # memory); rows past the elements are refused beyond MAX_EMPTY_ITEM_ROWS
    with pytest.raises(InferdError, match="more than its 0 elements"):
        batch_input_value("BATCH_ITEM_SHAPE", F32, [(ragged.MAX_EMPTY_ITEM_ROWS + 1, 0)])
    assert batch_input_value("BATCH_ITEM_SHAPE", I32, [(0, 7, 7), (3, 0)]).tolist() == [[0], [0], [0]]
    big = batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", I32, [(1 << 20, 1)])  # one row per element: fine
    assert big.shape == (1 << 20,) and big.dtype == I32


CONFIG = {
    "max_batch_size": 8,
    "input": [{"name": "R", "data_type": "TYPE_FP32", "dims": [-1, -1], "allow_ragged_batch": True},
              {"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [{"name": "RO", "data_type": "TYPE_FP32", "dims": [-1, -1]},
               {"name": "XO", "data_type": "TYPE_FP32", "dims": [2]}],
    "batch_input": [{"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT", "target_name": ["ACC", "ACC2"],
                     "data_type": "TYPE_INT32", "source_input": ["R"]},
                    {"kind": "BATCH_ITEM_SHAPE", "target_name": ["SHAPE"], "data_type": "TYPE_FP32",
                     "source_input": ["R"]}],
    "batch_output": [{"target_name": ["RO"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "source_input": ["R"]}],
}


def request(i: int, ragged_shape: tuple[int, ...]) -> Request:
    r = np.arange(int(np.prod(ragged_shape)), dtype=F32).reshape(ragged_shape) + 100 * i
    x = np.full((ragged_shape[0], 2), i, F32)
    return Request(i, str(i), [Tensor("R", "FP32", r), Tensor("X", "FP32", x)], [])


def test_feeds_flatten_ragged_inputs_and_add_batch_inputs():
    plan = RaggedPlan.from_config("m", CONFIG)
    assert plan is not None and plan.targets == ["ACC", "ACC2", "SHAPE"]
    requests = [request(1, (1, 2, 3)), request(2, (2, 1, 2)), request(3, (1, 1, 1))]
    merged = plan.feeds(requests)
    assert merged is not None
    feeds, sizes = merged
    assert sizes == [1, 2, 1]
    assert feeds["R"].shape == (6 + 4 + 1,)
    assert feeds["R"].tolist() == np.concatenate([r.inputs[0].array.reshape(-1) for r in requests]).tolist()
    assert feeds["X"].shape == (4, 2)  # not ragged: concatenated along dim 0
    assert feeds["ACC"].tolist() == [6, 10, 11] and feeds["ACC2"] is feeds["ACC"]
    assert feeds["SHAPE"].tolist() == [[2, 3], [1, 2], [1, 2], [1, 1]]


def test_one_request_is_flattened_too():
    plan = RaggedPlan.from_config("m", CONFIG)
    feeds, sizes = plan.feeds([request(1, (2, 2, 2))])
    assert feeds["R"].shape == (8,) and sizes == [2] and feeds["ACC"].tolist() == [8]


def test_split_scatters_batch_outputs_by_the_source_shape_and_rows_for_the_rest():
    plan = RaggedPlan.from_config("m", CONFIG)
    requests = [request(1, (1, 2, 3)), request(2, (2, 1, 2)), request(3, (1, 1, 1))]
    feeds, sizes = plan.feeds(requests)
    responses = plan.split(requests, [("RO", feeds["R"] * 2), ("XO", feeds["X"] + 1)], sizes, ["RO", "XO"])
    for req, resp in zip(requests, responses):
        out = {t.name: t.array for t in resp.outputs}
        assert out["RO"].shape == req.inputs[0].array.shape
        assert np.array_equal(out["RO"], req.inputs[0].array * 2)
        assert np.array_equal(out["XO"], req.inputs[1].array + 1)


def test_split_refuses_a_batch_output_too_small_for_the_requests():
    plan = RaggedPlan.from_config("m", CONFIG)
    requests = [request(1, (1, 2, 3)), request(2, (1, 1, 2))]
    with pytest.raises(InferdError) as info:
        plan.split(requests, [("RO", np.zeros(7, F32))], [1, 1], ["RO"])
    assert info.value.code == ErrorCode.INTERNAL and "'RO'" in info.value.message


def test_requests_whose_fixed_inputs_differ_do_not_share_a_run():
    plan = RaggedPlan.from_config("m", CONFIG)
    odd = Request(9, "9", [Tensor("R", "FP32", np.zeros((1, 2, 2), F32)), Tensor("X", "FP32", np.zeros((1, 3), F32))],
                  [])
    assert plan.feeds([request(1, (1, 2, 3)), odd]) is None


def test_a_config_without_ragged_batching_has_no_plan():
    assert RaggedPlan.from_config("m", {"max_batch_size": 4, "input": [{"name": "A", "dims": [-1]}]}) is None


def test_a_batch_input_without_its_source_fails_the_batch_naming_it():
    config = dict(CONFIG, input=CONFIG["input"] + [{"name": "O", "data_type": "TYPE_FP32", "dims": [1],
                                                    "optional": True}],
                  batch_input=[{"kind": "BATCH_ELEMENT_COUNT", "target_name": ["N"], "data_type": "TYPE_FP32",
                                "source_input": ["O"]}])
    plan = RaggedPlan.from_config("m", config)
    with pytest.raises(InferdError) as info:
        plan.feeds([request(1, (1, 2, 2))])
    assert "'O'" in info.value.message and "request '1'" in info.value.message


@pytest.mark.parametrize("entry", [
    {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["N"], "data_type": "TYPE_INT64", "source_input": ["R"]},
    {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["N"], "data_type": "TYPE_FP32", "source_input": ["NOPE"]},
    {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["N"], "data_type": "TYPE_FP32", "source_input": []},
])
def test_a_bad_batch_input_is_refused_at_load(entry):
    with pytest.raises(InferdError) as info:
        RaggedPlan.from_config("m", dict(CONFIG, batch_input=[entry]))
    assert info.value.code == ErrorCode.INVALID_ARG


def test_onnx_auto_complete_leaves_batch_input_targets_out_of_the_inputs(tmp_path):
    # they are the server's to make: as config inputs, every client would have to send them
    pytest.importorskip("onnxruntime")
    fm = pytest.importorskip("framework_models")
    from inferd.worker.backends import create
    from inferd.worker.backends.base import ModelSpec

    fm.onnx_ragged(tmp_path, "m")
    source = {"data_type": "TYPE_FP32", "source_input": ["RAGGED_INPUT"]}
    config = {"name": "m", "backend": "onnxruntime", "max_batch_size": 5,
              "input": [{"name": "RAGGED_INPUT", "data_type": "TYPE_FP32", "dims": [-1, -1],
                         "allow_ragged_batch": True}],
              "batch_input": [{"kind": k, "target_name": [t], **source}
                              for k, t in (("BATCH_ELEMENT_COUNT", "COUNT"), ("BATCH_ITEM_SHAPE", "ITEM"))]}
    spec = ModelSpec("m", str(tmp_path / "m"), "1", "{}", "onnxruntime")
    completed = create("onnxruntime").auto_complete(spec, config)
    assert [i["name"] for i in completed["input"]] == ["RAGGED_INPUT", "ACC", "ACC0", "MAXS", "FLAT"]
    assert {o["name"] for o in completed["output"]} == set(fm.RAGGED_OUTPUTS)
