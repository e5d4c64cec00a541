"""versions.py, metadata.py and autocomplete.py."""

from __future__ import annotations

import json

import pytest
from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.supervisor.repository import autocomplete, metadata, versions
from inferd.supervisor.repository import config as C
from inferd.worker.wire.errors import ErrorCode, InferdError


def policy(text: str) -> mc.ModelVersionPolicy:
    return C.parse_pbtxt("version_policy { %s }" % text).version_policy


@pytest.mark.parametrize(
    "text, on_disk, expected",
    [
        ("latest { num_versions: 1 }", [1, 2, 10], (10,)),
        ("latest { num_versions: 2 }", [3, 1, 2], (2, 3)),
        ("latest { num_versions: 5 }", [1, 2], (1, 2)),
        ("all { }", [2, 0, 1], (0, 1, 2)),
        ("specific { versions: [ 1, 3 ] }", [1, 2, 3], (1, 3)),
    ],
)
def test_select_versions(text: str, on_disk: list[int], expected: tuple[int, ...]) -> None:
    sel = versions.select_versions("m", policy(text), on_disk)
    assert sel.versions == expected and sel.warnings == ()


def test_default_policy_is_latest_one() -> None:
    assert versions.select_versions("m", mc.ModelVersionPolicy(), [1, 4, 2]).versions == (4,)


def test_specific_missing_version_is_reported_like_triton() -> None:
    sel = versions.select_versions("spec_missing", policy("specific { versions: [ 1, 3 ] }"), [1])
    assert sel.versions == (1,)
    assert sel.warnings == (
        "version 3 is specified for model 'spec_missing', but the version directory is not present",)


@pytest.mark.parametrize("text, on_disk", [("latest { num_versions: 1 }", []), ("specific { versions: [ 7 ] }", [1]),
                                           ("latest { num_versions: 0 }", [1]), ("all { }", [])])
def test_nothing_to_load_is_an_error(text: str, on_disk: list[int]) -> None:
    with pytest.raises(InferdError) as e:
        versions.select_versions("m", policy(text), on_disk)
    assert e.value.message == "at least one version must be available under the version policy of model 'm'"


def test_resolve_version() -> None:
    ready = {1: True, 2: True, 3: False}
    assert versions.resolve_version("m", "", ready) == 2
    assert versions.resolve_version("m", None, ready) == 2
    assert versions.resolve_version("m", -1, ready) == 2
    assert versions.resolve_version("m", "1", ready) == 1
    assert versions.resolve_version("m", 2, ready) == 2
    cases = [("3", ErrorCode.UNAVAILABLE, "Request for unknown model: 'm' version 3 is not at ready state"),
             ("7", ErrorCode.NOT_FOUND, "Request for unknown model: 'm' version 7 is not found"),
             ("abc", ErrorCode.INVALID_ARG, "failed to parse model version 'abc'"),
             ("1.5", ErrorCode.INVALID_ARG, "failed to parse model version"),
             ("-3", ErrorCode.INVALID_ARG, "invalid model version -3"),
             ("٣", ErrorCode.INVALID_ARG, "failed to parse model version")]
    for req, code, msg in cases:
        with pytest.raises(InferdError) as e:
            versions.resolve_version("m", req, ready)
        assert e.value.code == code and msg in e.value.message, req
    with pytest.raises(InferdError) as e:
        versions.resolve_version("m", "", {1: False})
    assert e.value.code == ErrorCode.UNAVAILABLE
    assert e.value.message == "Request for unknown model: 'm' has no available versions"
    assert versions.unknown_model("x").code == ErrorCode.NOT_FOUND


# ---- metadata ----------------------------------------------------------------------------------------


def test_metadata_shapes_and_platform() -> None:
    cfg = C.parse_pbtxt('''name: "m" backend: "python" max_batch_size: 8
        input [ { name: "A" data_type: TYPE_STRING dims: [ -1 ] }, { name: "B" data_type: TYPE_BF16 dims: [ 2, 3 ]
                  reshape { shape: [ 6 ] } } ]
        output [ { name: "O" data_type: TYPE_BOOL dims: [ 1 ] } ]''')
    md = metadata.model_metadata(cfg, [3, 1])
    assert md == {"name": "m", "versions": ["1", "3"], "platform": "python",
                  "inputs": [{"name": "A", "datatype": "BYTES", "shape": [-1, -1]},
                             {"name": "B", "datatype": "BF16", "shape": [-1, 2, 3]}],
                  "outputs": [{"name": "O", "datatype": "BOOL", "shape": [-1, 1]}]}
    cfg.max_batch_size = 0
    cfg.platform = "onnxruntime_onnx"
    md = metadata.model_metadata(cfg, ["2"])
    assert md["platform"] == "onnxruntime_onnx" and md["versions"] == ["2"]
    assert md["inputs"][1]["shape"] == [2, 3]
    assert metadata.datatype_name(mc.TYPE_INVALID) == "INVALID"
    assert metadata.datatype_name(mc.TYPE_FP16) == "FP16"


# ---- autocomplete ------------------------------------------------------------------------------------


def test_needs_autocomplete() -> None:
    py = C.parse_pbtxt('backend: "python"')
    ens = C.parse_pbtxt('platform: "ensemble"')
    assert autocomplete.needs_autocomplete(py, disable_flag=False)
    assert not autocomplete.needs_autocomplete(py, disable_flag=True)
    assert not autocomplete.needs_autocomplete(ens, disable_flag=False)


def test_apply_autocompleted() -> None:
    base = C.parse_pbtxt('name: "m" backend: "python"')
    answer = C.to_json_dict(base)
    answer["max_batch_size"] = 4
    answer["input"] = [{"name": "IN", "data_type": "TYPE_FP32", "dims": [3]}]
    answer["dynamic_batching"] = {}
    out = autocomplete.apply_autocompleted(base, json.dumps(answer))
    assert out.max_batch_size == 4 and out.input[0].name == "IN" and out.HasField("dynamic_batching")
    # fields left empty are kept from the original
    out = autocomplete.apply_autocompleted(base, {"max_batch_size": 2})
    assert (out.name, out.backend) == ("m", "python")


@pytest.mark.parametrize(
    "answer, fragment",
    [
        ({"name": "other"}, "may not change 'name'"),
        ({"backend": "onnxruntime"}, "may not change 'backend'"),
        ({"input": [{"name": "IN", "data_type": "TYPE_NOPE"}]}, "TYPE_NOPE"),
        ({"unknown_field": 1}, "unknown_field"),
        ("not json", "auto-completed configuration of model 'm'"),
    ],
)
def test_apply_autocompleted_rejects(answer: object, fragment: str) -> None:
    base = C.parse_pbtxt('name: "m" backend: "python"')
    with pytest.raises(InferdError) as e:
        autocomplete.apply_autocompleted(base, answer)  # type: ignore[arg-type]
    assert e.value.code == ErrorCode.INVALID_ARG and fragment in e.value.message
