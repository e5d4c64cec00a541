"""A bound model: its name, callables (one per instance), tensors and config; written as config.pbtxt.

The config names backend "external": the server waits for this process to connect the model's
workers instead of spawning them (docs/worker-protocol.md, "External workers").
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from inferd.worker.wire import dtypes

from .exceptions import PyTritonBadParameterError, PyTritonModelConfigError
from .model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def config_type(dtype: Any) -> str:
    """TYPE_* of a numpy dtype (bytes, str and object arrays are TYPE_STRING)."""
    try:
        found = dtypes.from_numpy(np.dtype(dtype))
    except TypeError:
        found = None
    if found is None:
        raise PyTritonBadParameterError("unsupported tensor dtype %r" % (dtype,))
    return found.config_name


@dataclasses.dataclass
class BoundModel:
    name: str
    callables: list[Callable[..., Any]]
    inputs: list[Tensor]
    outputs: list[Tensor]
    config: ModelConfig
    strict: bool = False

    @classmethod
    def create(cls, name: str, infer_func: Any, inputs: Sequence[Tensor], outputs: Sequence[Tensor],
               config: ModelConfig | None, strict: bool) -> BoundModel:
        if not _NAME.match(name or ""):
            raise PyTritonBadParameterError("model name %r: use letters, digits, '_', '.', '-'" % name)
        funcs = list(infer_func) if isinstance(infer_func, (list, tuple)) else [infer_func]
        if not funcs or not all(callable(f) for f in funcs):
            raise PyTritonBadParameterError("infer_func of model '%s' must be a callable or a list of them" % name)
        config = config or ModelConfig()
        if config.batching and config.max_batch_size < 1:
            raise PyTritonModelConfigError("model '%s': max_batch_size must be >= 1 with batching" % name)
        named_in = [t if t.name else dataclasses.replace(t, name="INPUT_%d" % (i + 1)) for i, t in enumerate(inputs)]
        named_out = [t if t.name else dataclasses.replace(t, name="OUTPUT_%d" % (i + 1))
                     for i, t in enumerate(outputs)]
        for t in (*named_in, *named_out):
            config_type(t.dtype)
        return cls(name, funcs, named_in, named_out, config, strict)

    def output_dtypes(self) -> dict[str, np.dtype]:
        return {str(t.name): np.dtype(t.dtype) for t in self.outputs}

    def config_dict(self) -> dict[str, Any]:
        """The model configuration in Triton's JSON form."""
        cfg = self.config
        doc: dict[str, Any] = {
            "name": self.name, "backend": "external",
            "max_batch_size": cfg.max_batch_size if cfg.batching else 0,
            "input": [_tensor_json(t, True) for t in self.inputs],
            "output": [_tensor_json(t, False) for t in self.outputs],
            "instance_group": [{"count": len(self.callables), "kind": "KIND_CPU"}],
        }
        if cfg.batching:
            doc["dynamic_batching"] = _batcher_json(cfg.batcher or DynamicBatcher())
        if cfg.decoupled:
            doc["model_transaction_policy"] = {"decoupled": True}
        if cfg.response_cache:
            doc["response_cache"] = {"enable": True}
        return doc

    def write(self, repository: str) -> None:
        """`<repository>/<name>/config.pbtxt` and the (empty) version directory `1/`."""
        folder = os.path.join(repository, self.name)
        os.makedirs(os.path.join(folder, "1"), exist_ok=True)
        with open(os.path.join(folder, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(to_pbtxt(self.config_dict()))


def _tensor_json(t: Tensor, is_input: bool) -> dict[str, Any]:
    shape = [int(d) for d in t.shape] or [1]
    doc: dict[str, Any] = {"name": t.name, "data_type": config_type(t.dtype), "dims": shape}
    if is_input and t.optional:
        doc["optional"] = True
    return doc


def _policy_json(p: QueuePolicy) -> dict[str, Any]:
    return {"timeout_action": p.timeout_action.value, "default_timeout_microseconds": p.default_timeout_microseconds,
            "allow_timeout_override": p.allow_timeout_override, "max_queue_size": p.max_queue_size}


def _batcher_json(b: DynamicBatcher) -> dict[str, Any]:
    doc: dict[str, Any] = {"max_queue_delay_microseconds": int(b.max_queue_delay_microseconds),
                           "preserve_ordering": bool(b.preserve_ordering)}
    if b.preferred_batch_size:
        doc["preferred_batch_size"] = [int(x) for x in b.preferred_batch_size]
    if b.priority_levels:
        doc["priority_levels"] = int(b.priority_levels)
        doc["default_priority_level"] = int(b.default_priority_level)
    if b.default_queue_policy is not None:
        doc["default_queue_policy"] = _policy_json(b.default_queue_policy)
    if b.priority_queue_policy:
        doc["priority_queue_policy"] = {int(k): _policy_json(v) for k, v in b.priority_queue_policy.items()}
    return doc


_ENUMS = {"data_type", "kind", "timeout_action"}


def to_pbtxt(doc: dict[str, Any], indent: str = "") -> str:
    """A JSON-form model configuration as protobuf text (enums bare, maps as key/value entries)."""
    lines: list[str] = []
    for key, value in doc.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                if key == "priority_queue_policy":
                    for k, v in item.items():
                        body = to_pbtxt(v, "").replace("\n", " ")
                        lines.append("%s%s { key: %d value { %s } }" % (indent, key, k, body))
                    continue
                lines.append("%s%s {\n%s%s}" % (indent, key, to_pbtxt(item, indent + "  "), indent))
            elif isinstance(item, bool):
                lines.append("%s%s: %s" % (indent, key, "true" if item else "false"))
            elif isinstance(item, (int, float)) or key in _ENUMS:
                lines.append("%s%s: %s" % (indent, key, item))
            else:
                lines.append("%s%s: %s" % (indent, key, json.dumps(str(item))))
    return "\n".join(lines) + "\n"
