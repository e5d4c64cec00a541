"""Control-input and implicit-state parsing and the wire bytes the sequence batcher injects."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from inferd.supervisor.inference.types import InferResponse, Tensor
from inferd.supervisor.scheduler.sequence import controls as sc
from inferd.supervisor.scheduler.sequence import state as ss
from inferd.worker.wire.errors import InferdError

SB = {"control_input": [
    {"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
    {"name": "E", "control": [{"kind": "CONTROL_SEQUENCE_END", "fp32_false_true": [0.5, 2.5]}]},
    {"name": "R", "control": [{"kind": "CONTROL_SEQUENCE_READY", "bool_false_true": [False, True]}]},
    {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
]}


def _by_name(tensors: list[Tensor]) -> dict[str, Tensor]:
    return {t.name: t for t in tensors}


def test_flags_and_corrid_in_wire_form() -> None:
    controls = sc.parse_controls("m", SB)
    got = _by_name(sc.control_tensors(controls, start=True, end=False, ready=True, correlation_id=77, batched=True))
    assert got["S"].datatype == "INT32" and got["S"].shape == [1, 1] and got["S"].data == struct.pack("<i", 1)
    assert got["E"].datatype == "FP32" and got["E"].data == struct.pack("<f", 0.5)
    assert got["R"].datatype == "BOOL" and got["R"].data == b"\x01"
    assert got["C"].datatype == "UINT64" and got["C"].data == struct.pack("<Q", 77)
    null = _by_name(sc.control_tensors(controls, start=False, end=True, ready=False, correlation_id=0,
                                       batched=False))
    assert null["S"].shape == [1] and null["S"].data == struct.pack("<i", 0)
    assert null["E"].data == struct.pack("<f", 2.5) and null["R"].data == b"\x00"
    assert null["C"].data == struct.pack("<Q", 0)


@pytest.mark.parametrize("data_type,fmt,corr,expected", [
    ("TYPE_INT64", "<q", 2**64 - 1, -1),  # a uint64 id seen through an INT64 CORRID
    ("TYPE_UINT32", "<I", 2**32 + 5, 5),
    ("TYPE_INT32", "<i", 7, 7),
])
def test_numeric_corrid_types(data_type: str, fmt: str, corr: int, expected: int) -> None:
    (control,) = sc.parse_controls("m", {"control_input": [
        {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": data_type}]}]})
    assert struct.unpack(fmt, sc.corrid_bytes(control, corr))[0] == expected


def test_string_ids() -> None:
    (text,) = sc.parse_controls("m", {"control_input": [
        {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}]}]})
    assert text.datatype == "BYTES"
    assert sc.corrid_bytes(text, "abc") == struct.pack("<I", 3) + b"abc"
    assert sc.corrid_bytes(text, 42) == struct.pack("<I", 2) + b"42"
    (number,) = sc.parse_controls("m", {"control_input": [
        {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]}]})
    a, b = sc.corrid_bytes(number, "abc"), sc.corrid_bytes(number, "abd")
    assert a == sc.corrid_bytes(number, "abc") and a != b  # stable, distinct hashes


def test_bad_controls_are_refused() -> None:
    with pytest.raises(InferdError, match="false/true pair"):
        sc.parse_controls("m", {"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]})
    with pytest.raises(InferdError, match="CORRID data_type"):
        sc.parse_controls("m", {"control_input": [
            {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_FP32"}]}]})


def test_state_initial_capture_and_strip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(np.array([5, 6], dtype="<i4").tobytes())
    sb = {"state": [
        {"input_name": "A_IN", "output_name": "A_OUT", "data_type": "TYPE_FP32", "dims": ["2"]},
        {"input_name": "B_IN", "output_name": "B_OUT", "data_type": "TYPE_INT32", "dims": [2],
         "initial_state": [{"data_type": "TYPE_INT32", "dims": ["2"], "data_file": "init.bin"}]},
        {"input_name": "G_IN", "output_name": "G_OUT", "data_type": "TYPE_FP32", "dims": [-1]},
    ]}
    states = ss.parse_states("m", sb, str(tmp_path))
    init = ss.initial_tensors(states, batched=True)
    assert init["A_IN"].shape == [1, 2] and init["A_IN"].data == bytes(8)
    assert np.frombuffer(init["B_IN"].data, "<i4").tolist() == [5, 6]
    assert init["G_IN"].shape == [1, 0]  # a variable dim starts empty
    response = InferResponse("m", "1", outputs=[Tensor("OUT", "FP32", [1], b"\0" * 4),
                                                Tensor("A_OUT", "FP32", [1, 2], memoryview(b"12345678"))])
    nxt = ss.capture(states, response, init)
    assert [t.name for t in response.outputs] == ["OUT"]  # the client never sees the state
    assert nxt["A_IN"].data == b"12345678" and nxt["A_IN"].name == "A_IN"
    assert nxt["B_IN"] is init["B_IN"]  # not returned: unchanged


def test_state_data_file_checks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sb = {"state": [{"input_name": "I", "output_name": "O", "data_type": "TYPE_INT32", "dims": [2],
                     "initial_state": [{"data_type": "TYPE_INT32", "dims": [2], "data_file": "../escape"}]}]}
    with pytest.raises(InferdError, match="outside"):
        ss.parse_states("m", sb, str(tmp_path))
    sb["state"][0]["initial_state"][0]["data_file"] = "missing.bin"
    with pytest.raises(InferdError, match="cannot read"):
        ss.parse_states("m", sb, str(tmp_path))


def test_negative_int64_ids_read_as_uint64() -> None:
    (control,) = sc.parse_controls("m", {"control_input": [
        {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]}]})
    assert sc.corrid_bytes(control, -1) == struct.pack("<Q", 2**64 - 1)
