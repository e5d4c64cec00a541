"""conventions.ModelInputs.tensor packs one value directly (a prompt, a flag, a number: the inputs every
completion sends) and must give exactly what the general path (inference/tensors.json_to_raw) gives, or
refuse as it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from inferd.supervisor.inference.tensors import json_to_raw
from inferd.supervisor.openai_api.conventions import ModelInputs, _shape
from inferd.supervisor.openai_api.errors import OpenAIError
from inferd.worker.wire.errors import InferdError

TYPES = ["TYPE_STRING", "TYPE_BOOL", "TYPE_INT32", "TYPE_INT64", "TYPE_UINT32", "TYPE_UINT64", "TYPE_FP32",
         "TYPE_FP64", "TYPE_INT8", "TYPE_UINT8", "TYPE_FP16"]
VALUES = ["text", "", "ünï\u20ac", "\ud800", True, False, 0, 1, -1, 7, 2**31 - 1, 2**31, -(2**31) - 1, 2**63,
          2**64, -(2**63), 255, 256, -129, 1.5, 0.1, float("inf"), 1e300, None, [1], {"a": 1}]


def _general(inputs: ModelInputs, name: str, value: Any) -> Any:
    spec = inputs.specs[name]
    datatype = str(spec["data_type"]).removeprefix("TYPE_")
    datatype = "BYTES" if datatype == "STRING" else datatype
    shape = _shape(name, [int(d) for d in spec["dims"]], inputs.batched, 1)
    return name, datatype, shape, json_to_raw(datatype, shape, [value], name)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        t = fn(*args)
    except (OpenAIError, InferdError) as exc:
        return type(exc).__name__, str(exc)
    except Exception as exc:  # the same unexpected error either way
        return type(exc).__name__
    return t if isinstance(t, tuple) else (t.name, t.datatype, t.shape, bytes(t.data))


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("dims", [[1], [-1], [1, 1], [2]])
def test_one_value_packs_as_the_general_path(batched: bool, dims: list[int]) -> None:
    config = {"max_batch_size": 8 if batched else 0,
              "input": [{"name": f"in_{t}", "data_type": t, "dims": dims} for t in TYPES]}
    inputs = ModelInputs.of(config)
    for t in TYPES:
        for value in VALUES:
            for _ in range(2):  # the first call fills the cache, the second uses it
                fast = _outcome(inputs.tensor, f"in_{t}", [value])
                assert fast == _outcome(_general, inputs, f"in_{t}", value), (t, dims, value)


def test_a_tensor_shape_is_its_own() -> None:
    inputs = ModelInputs.of({"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_INT32", "dims": [1]}]})
    a, b = inputs.tensor("x", [1]), inputs.tensor("x", [2])
    a.shape.append(5)
    assert b.shape == [1, 1] and inputs.tensor("x", [3]).shape == [1, 1]
