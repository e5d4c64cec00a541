"""config.py: config.pbtxt parsing, JSON overrides, load_config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.supervisor.repository import config as C
from inferd.supervisor.repository import layout
from inferd.worker.wire.errors import ErrorCode, InferdError

from . import samples
from .conftest import write_model


@pytest.mark.parametrize("name", sorted(samples.ALL))
def test_real_world_samples_parse(name: str) -> None:
    cfg = C.parse_pbtxt(samples.ALL[name], name + "/config.pbtxt")
    assert isinstance(cfg, mc.ModelConfig)
    assert cfg.input and cfg.output


def test_sample_fields() -> None:
    d = C.parse_pbtxt(samples.DENSENET_ONNX)
    assert d.platform == "onnxruntime_onnx"
    assert list(d.input[0].reshape.shape) == [1, 3, 224, 224]
    assert d.input[0].format == mc.ModelInput.FORMAT_NCHW
    assert d.output[0].label_filename == "densenet_labels.txt"
    s = C.parse_pbtxt(samples.SIMPLE_SEQUENCE)
    assert s.sequence_batching.control_input[2].control[0].data_type == mc.TYPE_UINT64
    e = C.parse_pbtxt(samples.ENSEMBLE)
    assert e.ensemble_scheduling.step[0].model_version == -1
    assert dict(e.ensemble_scheduling.step[1].input_map) == {"data_0": "preprocessed_image"}
    llm = C.parse_pbtxt(samples.LLM_DECOUPLED)
    assert llm.model_transaction_policy.decoupled is True
    assert llm.parameters["max_tokens"].string_value == "512"
    t = C.parse_pbtxt(samples.RESNET_TRT)
    assert t.cc_model_filenames["8.0"] == "model_a100.plan"
    assert t.dynamic_batching.default_queue_policy.max_queue_size == 64


def test_parse_error_names_file_line_and_column() -> None:
    text = 'backend: "python"\ninput [ { name: "IN" data_type: TYPE_INT32 dimz: [ 1 ] } ]\n'
    with pytest.raises(InferdError) as e:
        C.parse_pbtxt(text, "/models/m/config.pbtxt")
    assert e.value.code == ErrorCode.INVALID_ARG
    msg = e.value.message
    assert "/models/m/config.pbtxt" in msg and "line 2 column" in msg and "dimz" in msg


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("max_batch_size: 8\nmax_batch_size: 4\n", "max_batch_size"),  # non-repeated field twice
        ("input [ { data_type: TYPE_NOPE } ]", "TYPE_NOPE"),
        ("max_batch_size: -x", "max_batch_size"),
        ('name: "unterminated\n', "line 1"),
        ("dynamic_batching { } sequence_batching { }", "oneof"),
    ],
)
def test_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(InferdError) as e:
        C.parse_pbtxt(text, "c.pbtxt")
    assert e.value.code == ErrorCode.INVALID_ARG
    assert fragment in e.value.message and "c.pbtxt" in e.value.message


def test_enum_by_number_and_empty_list() -> None:
    cfg = C.parse_pbtxt('input [ { name: "x" data_type: 11 dims: [ ] } ]')
    assert cfg.input[0].data_type == mc.TYPE_FP32 and list(cfg.input[0].dims) == []


def test_load_config(repo: Path) -> None:
    write_model(repo, "a", 'backend: "python"\n')
    write_model(repo, "b")
    write_model(repo, "bad", "max_batch_size: what\n")
    a = C.load_config(layout.read_model(str(repo), "a"))
    assert a.backend == "python"
    assert C.load_config(layout.read_model(str(repo), "b")) == mc.ModelConfig()
    with pytest.raises(InferdError, match="auto-complete is disabled"):
        C.load_config(layout.read_model(str(repo), "b"), disable_auto_complete=True)
    with pytest.raises(InferdError) as e:
        C.load_config(layout.read_model(str(repo), "bad"))
    assert str(repo / "bad" / "config.pbtxt") in e.value.message and "line 1" in e.value.message


# ---- JSON overrides -----------------------------------------------------------------------------------


def test_json_override_case_insensitive_enums_and_both_field_spellings() -> None:
    text = json.dumps({
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "IN", "data_type": "type_fp32", "dims": [4], "format": "format_nchw"}],
        "output": [{"name": "OUT", "dataType": "Type_Int64", "dims": ["3"]}],
        "instance_group": [{"kind": "kind_cpu", "count": 2}],
        "dynamic_batching": {"priority_levels": "2", "default_priority_level": 1,
                             "priority_queue_policy": {"1": {"timeout_action": "delay"}}},
        "parameters": {"k": {"string_value": "v"}},
    })
    cfg = C.parse_json_config(text)
    assert cfg.input[0].data_type == mc.TYPE_FP32
    assert cfg.input[0].format == mc.ModelInput.FORMAT_NCHW
    assert cfg.output[0].data_type == mc.TYPE_INT64 and list(cfg.output[0].dims) == [3]
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert cfg.dynamic_batching.priority_queue_policy[1].timeout_action == mc.ModelQueuePolicy.DELAY
    assert cfg.parameters["k"].string_value == "v"


@pytest.mark.parametrize(
    "data, fragment",
    [
        ('{"backend": "python", "bogus": 1}', "bogus"),
        ('{"input": [{"name": "x", "nope": true}]}', "nope"),
        ('{"input": [{"data_type": "TYPE_WHAT"}]}', "TYPE_WHAT"),
        ('{"max_batch_size": "lots"}', "max_batch_size"),
        ("[1, 2]", "expected an object"),
        ("{not json", "failed to parse"),
        ("[" * 100_000 + "]" * 100_000, "failed to parse"),
        ('{"version_policy": {"latest": {}, "all": {}}}', "failed to parse"),
    ],
)
def test_json_override_errors(data: str, fragment: str) -> None:
    with pytest.raises(InferdError) as e:
        C.parse_json_config(data)
    assert e.value.code == ErrorCode.INVALID_ARG
    assert fragment in e.value.message


def test_json_deeply_nested_value_is_invalid_arg() -> None:
    deep = json.dumps({"backend": "python"})[:-1] + ', "x": ' + "[" * 3000 + "]" * 3000 + "}"
    with pytest.raises(InferdError):
        C.parse_json_config(deep)


def test_json_roundtrip_of_rendering() -> None:
    for name, text in samples.ALL.items():
        cfg = C.parse_pbtxt(text, name)
        back = C.parse_json_config(C.to_json(cfg))
        assert back == cfg, name
