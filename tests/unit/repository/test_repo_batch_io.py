"""batch_io.py: batch_input / batch_output checked at load with Triton 2.51's messages (each observed on the
real server, a Python model: tests/e2e/test_ragged_batching.py loads the same configs on both)."""

from __future__ import annotations

from pathlib import Path

import pytest
from inferd.supervisor.repository import config as C
from inferd.supervisor.repository import layout
from inferd.worker.wire.errors import ErrorCode, InferdError

from .conftest import write_model

BASE = """backend: "python"
max_batch_size: 8
input [ { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "O" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "P" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def load(repo: Path, extra: str):
    write_model(repo, "m", BASE + extra)
    src = layout.read_model(str(repo), "m")
    return C.normalize(C.load_config(src), src)


@pytest.mark.parametrize("extra, message", [
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_FP32 } ]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"),
    ('batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "X" data_type: TYPE_FP32 source_input: ["R", "B"] } ]',
     "batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 2 for m"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_INT64 source_input: "R" } ]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" source_input: "R" } ]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_FP32 source_input: "NOPE" } ]',
     "unknown source input name 'NOPE' for m"),
    ('batch_output [ { target_name: "O" kind: BATCH_SCATTER_WITH_INPUT_SHAPE } ]',
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for m"),
    ('batch_output [ { target_name: "O" source_input: "NOPE" } ]', "unknown source input name 'NOPE' for m"),
    ('batch_output [ { target_name: "NOPE" source_input: "R" } ]', "unknown target output name 'NOPE' for m"),
    ('batch_output [ { target_name: ["O", "O"] source_input: "R" } ]',
     "target output name 'O' can only be specified once for m"),
    # Triton 2.51 dies of a segmentation fault on this one
    ('batch_output [ { source_input: "R" } ]',
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects at least 1 target output name, got 0 for m"),
])
def test_bad_batch_io_fails_the_load_with_tritons_message(repo, extra, message):
    with pytest.raises(InferdError) as info:
        load(repo, extra)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == message


def test_good_batch_io_is_kept_as_written(repo):
    cfg = load(repo, 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: ["X", "Y"] data_type: TYPE_INT32 '
                     'source_input: "R" }, { kind: BATCH_ELEMENT_COUNT data_type: TYPE_FP32 source_input: "B" } ]\n'
                     'batch_output [ { target_name: ["O", "P"] source_input: "R" } ]\n')
    out = C.to_json_dict(cfg)
    assert out["batch_input"] == [
        {"kind": "BATCH_ITEM_SHAPE", "target_name": ["X", "Y"], "data_type": "TYPE_INT32", "source_input": ["R"]},
        {"kind": "BATCH_ELEMENT_COUNT", "target_name": [], "data_type": "TYPE_FP32", "source_input": ["B"]}]
    assert out["batch_output"] == [
        {"target_name": ["O", "P"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "source_input": ["R"]}]


def test_names_wait_for_auto_complete_when_the_config_has_no_io(repo):
    # inputs and outputs a backend fills in are checked on the pass after auto-complete
    write_model(repo, "m", 'backend: "python"\nmax_batch_size: 8\nbatch_input [ { kind: BATCH_ELEMENT_COUNT '
                           'target_name: "X" data_type: TYPE_FP32 source_input: "LATER" } ]\n')
    src = layout.read_model(str(repo), "m")
    assert C.normalize(C.load_config(src), src).batch_input[0].source_input == ["LATER"]


@pytest.mark.parametrize("extra, message", [
    ('batch_input [ { kind: 99 target_name: "X" data_type: TYPE_FP32 source_input: "R" } ]',
     "unknown batch input kind 99 for m"),
    ('batch_output [ { target_name: "O" kind: 99 source_input: "R" } ]',
     "unknown batch output kind 99 for m"),
])
def test_a_kind_given_by_an_undefined_number_is_a_load_error(tmp_path: Path, extra: str, message: str) -> None:
    """config.pbtxt may give an enum by number; one the enum does not define raised protobuf's ValueError out
    of the load (found by the fuzz campaign: fuzz/corpus/model_config/f7d388b67e69a878)."""
    with pytest.raises(InferdError) as e:
        load(tmp_path, extra)
    assert e.value.code is ErrorCode.INVALID_ARG and e.value.message == message
