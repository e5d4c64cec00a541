"""A model's configuration as the client reads it from the server (PyTriton's `TritonModelConfig`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
from inferd.worker.wire import dtypes


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple
    dtype: Any
    optional: bool = False


@dataclasses.dataclass
class TritonModelConfig:
    model_name: str
    model_version: int = 1
    max_batch_size: int = 0
    batching: bool = False
    decoupled: bool = False
    inputs: list[TensorSpec] = dataclasses.field(default_factory=list)
    outputs: list[TensorSpec] = dataclasses.field(default_factory=list)
    backend: str = ""

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TritonModelConfig:
        mbs = int(doc.get("max_batch_size") or 0)
        return cls(model_name=str(doc.get("name", "")), max_batch_size=mbs, batching=mbs > 0,
                   decoupled=bool((doc.get("model_transaction_policy") or {}).get("decoupled", False)),
                   inputs=[_spec(t) for t in doc.get("input") or []],
                   outputs=[_spec(t) for t in doc.get("output") or []], backend=str(doc.get("backend", "")))


def _spec(t: dict[str, Any]) -> TensorSpec:
    found = dtypes.BY_CONFIG_NAME.get(str(t.get("data_type", "")))
    dtype: Optional[Any] = np.bytes_ if found is None or found.name == "BYTES" else (
        found.numpy.type if found.numpy is not None else np.uint16)
    return TensorSpec(str(t.get("name", "")), tuple(int(d) for d in t.get("dims") or []), dtype,
                      bool(t.get("optional", False)))
