"""Backend auto-complete, supervisor side (triton.md §4.3).

The merge itself happens in a throw-away worker (pb_utils.ModelConfig for Python models): the worker
receives `to_json_dict(normalize(config, ...))` and answers with the completed config as JSON. Here we
decide whether to ask, and check what came back before it replaces the config:

    cfg = normalize(load_config(src), src)
    if needs_autocomplete(cfg, server_config.disable_auto_complete_config):
        cfg = apply_autocompleted(cfg, answer_json_from_worker)
    cfg = normalize(cfg, src)           # second pass: defaults that depend on what was completed
"""

from __future__ import annotations

from typing import Any

from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.worker.wire.errors import invalid_arg

from .config import parse_json_config
from .normalize import ENSEMBLE

# Fields a backend may not change while auto-completing (it may fill them when they are empty).
_FIXED_FIELDS = ("name", "backend", "platform")


def needs_autocomplete(config: mc.ModelConfig, disable_flag: bool) -> bool:
    """Whether the backend's auto-complete step must run for this model.

    Off with --disable-auto-complete-config (or --strict-model-config=true); never for ensembles. For
    every other backend the worker runs it (Python: TritonPythonModel.auto_complete_config, which
    Triton calls even when config.pbtxt exists; other backends may derive I/O from the model file).
    """
    if disable_flag:
        return False
    return not (config.platform == ENSEMBLE or config.HasField("ensemble_scheduling"))


def apply_autocompleted(
    config: mc.ModelConfig, autocompleted_json: str | bytes | dict[str, Any]
) -> mc.ModelConfig:
    """The config the worker's auto-complete returned, validated against the one it was given.

    INVALID_ARG when the answer is not a valid ModelConfig JSON (unknown fields, bad enum names, wrong
    types) or when it changed the model's name, backend or platform.
    """
    what = f"auto-completed configuration of model '{config.name}'"
    completed = parse_json_config(autocompleted_json, what=what)
    for field in _FIXED_FIELDS:
        before, after = getattr(config, field), getattr(completed, field)
        if not after and before:
            setattr(completed, field, before)
        elif before and after != before:
            raise invalid_arg(
                f"auto-complete of model '{config.name}' may not change '{field}' "
                f"(was '{before}', got '{after}')"
            )
    return completed
