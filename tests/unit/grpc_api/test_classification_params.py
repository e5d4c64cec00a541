"""gRPC requested-output `classification` parameters, checked as Triton 2.51's gRPC frontend checks them."""

from __future__ import annotations

import pytest
from inferd.supervisor.grpc_api import convert
from inferd.worker.wire.errors import ErrorCode, InferdError


def core_outputs(params: dict) -> list:
    msg = convert.ParsedRequest("m", outputs=[convert.ParsedOutput("OUT", params)])
    req, _ = convert.to_core(msg, None)  # type: ignore[arg-type]  # no shared memory: no dataplane needed
    return req.outputs


def test_int64_count_reaches_the_core():
    (out,) = core_outputs({"classification": ("int64_param", 3), "binary_data": ("bool_param", True)})
    assert (out.name, out.parameters) == ("OUT", {"classification": 3})


@pytest.mark.parametrize("param", [("uint64_param", 2), ("string_param", "2"), ("bool_param", True),
                                   ("double_param", 2.0), (None, None)])
def test_other_value_types_are_refused(param):
    with pytest.raises(InferdError) as info:
        core_outputs({"classification": param})
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == "invalid value type for 'classification' parameter, expected int64_param"


@pytest.mark.parametrize("value", [0, -1, -(2**63)])
def test_counts_below_one_are_refused(value):
    with pytest.raises(InferdError) as info:
        core_outputs({"classification": ("int64_param", value)})
    assert info.value.message == "invalid value for 'classification' parameter, expected >= 0"


def test_classification_with_shared_memory_is_refused():
    with pytest.raises(InferdError) as info:
        core_outputs({"classification": ("int64_param", 1), "shared_memory_region": ("string_param", "r"),
                      "shared_memory_byte_size": ("int64_param", 64)})
    assert info.value.message == "Output can't set both 'shared_memory_region' and 'classification'"
