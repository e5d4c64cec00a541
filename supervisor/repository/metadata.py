"""Model metadata JSON (triton.md §1.1), as Triton's GET /v2/models/{m}[/versions/{v}] returns it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.worker.wire.dtypes import BY_CONFIG_NUMBER


def datatype_name(data_type: int) -> str:
    """Protocol datatype string of a config enum value ("FP32", "BYTES", ...); "INVALID" when unknown."""
    d = BY_CONFIG_NUMBER.get(int(data_type))
    return d.name if d is not None else "INVALID"


def tensor_shape(config: mc.ModelConfig, dims: Iterable[int]) -> list[int]:
    """Full shape clients see: `[-1] + dims` when max_batch_size > 0, else `dims` (reshape is not shown)."""
    shape = [int(d) for d in dims]
    return [-1] + shape if config.max_batch_size > 0 else shape


def _tensors(
    config: mc.ModelConfig, ios: Iterable[mc.ModelInput] | Iterable[mc.ModelOutput]
) -> list[dict[str, Any]]:
    return [
        {"name": io.name, "datatype": datatype_name(io.data_type), "shape": tensor_shape(config, io.dims)}
        for io in ios
    ]


def model_metadata(config: mc.ModelConfig, versions: Iterable[int | str]) -> dict[str, Any]:
    """{"name", "versions": [str], "platform", "inputs", "outputs"}.

    `versions`: the requested version, or every READY version (the caller decides), in ascending order.
    `platform` is config.platform, or config.backend when the platform is empty ("python").
    """
    ordered = sorted({int(v) for v in versions})
    return {
        "name": config.name,
        "versions": [str(v) for v in ordered],
        "platform": config.platform or config.backend,
        "inputs": _tensors(config, config.input),
        "outputs": _tensors(config, config.output),
    }
