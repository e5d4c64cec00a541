"""Model configuration: parse config.pbtxt and JSON overrides, render the JSON Triton serves.

- `parse_pbtxt`: protobuf text format of `inference.ModelConfig`; errors name the file, line and column.
- `parse_json_config`: the JSON rendering (load API `config` parameter, auto-complete results); enum names
  are case-insensitive and unknown fields are rejected (triton.md §3.11).
- `load_config`: the raw config of a `ModelSource` (empty when there is no config file).
- `normalize`, `validate`: see normalize.py (re-exported here).
- `to_json_dict`: triton.md §3.11, checked field for field against real Triton 2.51 output
  (tests/unit/repository/golden/).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.worker.wire.errors import invalid_arg

from .layout import ModelSource

ModelConfig = mc.ModelConfig

MAX_JSON_CONFIG_BYTES = 4 * 1024 * 1024

__all__ = [
    "ModelConfig",
    "load_config",
    "normalize",
    "parse_json_config",
    "parse_pbtxt",
    "to_json",
    "to_json_dict",
    "validate",
]


def parse_pbtxt(text: str, path: str = "config.pbtxt") -> mc.ModelConfig:
    """Parse protobuf text format; INVALID_ARG naming the file, line and column on error."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        msg = str(e)
        line, col = e.GetLine(), e.GetColumn()
        if line is not None and msg.startswith(f"{line}:{col} : "):
            msg = msg[len(f"{line}:{col} : "):]
        where = f" line {line} column {col}" if line is not None else ""
        raise invalid_arg(f"failed to parse model configuration '{path}'{where}: {msg}") from e
    return config


def load_config(source: ModelSource, disable_auto_complete: bool = False) -> mc.ModelConfig:
    """The config as written in the repository: parsed config file, or an empty config when there is none.

    A missing config file is an error only when auto-complete is disabled (triton.md §4.4).
    """
    if source.config_text is None:
        if disable_auto_complete:
            raise invalid_arg(
                f"model '{source.name}' has no configuration file ({source.path}/config.pbtxt) "
                "and auto-complete is disabled"
            )
        return mc.ModelConfig()
    return parse_pbtxt(source.config_text, source.config_path or source.path)


# ---- JSON in ---------------------------------------------------------------------------------------------


def _fix_enum_case(value: Any, descriptor: Descriptor, where: str) -> Any:
    """Upper-case enum names (Triton parses JSON enums case-insensitively); descend into messages/maps."""
    if not isinstance(value, dict):
        return value
    fields = {f.name: f for f in descriptor.fields}
    fields.update({f.json_name: f for f in descriptor.fields})
    out: dict[str, Any] = {}
    for key, v in value.items():
        f = fields.get(key)
        if f is None:
            out[key] = v  # json_format reports unknown fields with a precise message
            continue
        out[key] = _fix_field(v, f, where + "." + f.name)
    return out


def _fix_field(v: Any, f: FieldDescriptor, where: str) -> Any:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        if not isinstance(v, dict):
            return v
        value_field = f.message_type.fields_by_name["value"]
        return {k: _fix_single(x, value_field, where) for k, x in v.items()}
    if f.is_repeated and isinstance(v, list):
        return [_fix_single(x, f, where) for x in v]
    return _fix_single(v, f, where)


def _fix_single(v: Any, f: FieldDescriptor, where: str) -> Any:
    if f.enum_type is not None and isinstance(v, str):
        upper = v.upper()
        for name in f.enum_type.values_by_name:
            if name.upper() == upper:
                return name
        return v
    if f.message_type is not None:
        return _fix_enum_case(v, f.message_type, where)
    return v


def parse_json_config(
    data: str | bytes | dict[str, Any], what: str = "model configuration"
) -> mc.ModelConfig:
    """Parse the JSON rendering of a ModelConfig (strict: unknown fields are INVALID_ARG)."""
    if isinstance(data, (str, bytes, bytearray)):
        if len(data) > MAX_JSON_CONFIG_BYTES:
            raise invalid_arg(f"{what} JSON is larger than {MAX_JSON_CONFIG_BYTES} bytes")
        try:
            obj = json.loads(data)
        except RecursionError as e:
            raise invalid_arg(f"failed to parse {what} JSON: nested too deeply") from e
        except ValueError as e:
            raise invalid_arg(f"failed to parse {what} JSON: {e}") from e
    else:
        obj = data
    if not isinstance(obj, dict):
        raise invalid_arg(f"failed to parse {what} JSON: expected an object, got {type(obj).__name__}")
    config = mc.ModelConfig()
    try:
        fixed = _fix_enum_case(obj, mc.ModelConfig.DESCRIPTOR, "ModelConfig")
        json_format.ParseDict(fixed, config, ignore_unknown_fields=False)
    except RecursionError as e:
        raise invalid_arg(f"failed to parse {what} JSON: nested too deeply") from e
    except json_format.ParseError as e:
        msg = str(e).split("\n", 1)[0].strip()
        raise invalid_arg(f"failed to parse {what} JSON: {msg}") from e
    return config


# ---- JSON out --------------------------------------------------------------------------------------------

# int64/uint64 fields Triton's ModelConfigToJson turns back into JSON numbers, as (message, field). Measured
# on Triton 2.51: everything in triton.md §3.11 is unquoted; InitialState.dims, GraphSpec.Shape.dim and
# SecondaryDevice.device_id stay quoted strings, so they are left quoted here too.
_UNQUOTED: frozenset[tuple[str, str]] = frozenset(
    {
        ("inference.ModelInput", "dims"),
        ("inference.ModelOutput", "dims"),
        ("inference.ModelTensorReshape", "shape"),
        ("inference.ModelVersionPolicy.Specific", "versions"),
        ("inference.ModelDynamicBatching", "max_queue_delay_microseconds"),
        ("inference.ModelDynamicBatching", "priority_levels"),
        ("inference.ModelDynamicBatching", "default_priority_level"),
        ("inference.ModelQueuePolicy", "default_timeout_microseconds"),
        ("inference.ModelSequenceBatching", "max_sequence_idle_microseconds"),
        ("inference.ModelSequenceBatching.StrategyDirect", "max_queue_delay_microseconds"),
        ("inference.ModelSequenceBatching.StrategyOldest", "max_queue_delay_microseconds"),
        ("inference.ModelSequenceBatching.State", "dims"),
        ("inference.ModelEnsembling.Step", "model_version"),
        ("inference.ModelWarmup.Input", "dims"),
    }
)


def _num(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return v
    return v


def _render(d: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """Reorder keys to declaration order (as Triton prints them) and unquote the _UNQUOTED int64s."""
    out: dict[str, Any] = {}
    for f in descriptor.fields:
        if f.name not in d:
            continue
        v = d[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                v = {k: _render(x, value_field.message_type) for k, x in v.items()}
        elif f.message_type is not None:
            v = [_render(x, f.message_type) for x in v] if isinstance(v, list) else _render(v, f.message_type)
        elif (descriptor.full_name, f.name) in _UNQUOTED:
            v = [_num(x) for x in v] if isinstance(v, list) else _num(v)
        out[f.name] = v
    return out


def to_json_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """The JSON object Triton serves for GET .../config and passes as args['model_config'] (§3.11)."""
    raw = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _render(raw, mc.ModelConfig.DESCRIPTOR)


def to_json(config: mc.ModelConfig) -> str:
    """Compact JSON text of `to_json_dict`."""
    return json.dumps(to_json_dict(config), separators=(",", ":"))


from .normalize import normalize, validate  # noqa: E402  (re-exported; normalize.py needs nothing from here)
