"""Trace settings (the trace extension), kept as Triton 2.51 keeps them (server `tracer.cc`).

The global settings start at the defaults; a model's settings are only the fields set for that model,
the rest follow the global ones (also when those change later). `null` (HTTP) or an empty value list
(gRPC) clears a field: a model field then follows the global one again, a global field its default.
An update is parsed and checked whole before anything changes, so a refused update changes nothing.
The global defaults are the command line's (--trace-config); in mode `triton` a level other than OFF needs
the trace file given there (it cannot be set over the network), as Triton requires.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

DEFAULTS: dict[str, Any] = {
    "trace_level": ("OFF",), "trace_rate": 1000, "trace_count": -1, "log_frequency": 0, "trace_file": "",
}
_LEVELS = ("TIMESTAMPS", "TENSORS")  # in the order Triton lists them
_INT = re.compile(r"\s*[+-]?\d+")  # what std::stoi reads: leading blanks, a sign, digits; the rest ignored
_INT32 = (-(1 << 31), (1 << 31) - 1)
_UINT32_MAX = (1 << 32) - 1
_CLEAR = object()


def _bad(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


class TraceSettings:
    def __init__(self, defaults: Mapping[str, Any] | None = None, mode: str = "triton",
                 shown: Mapping[str, str] | None = None) -> None:
        self._defaults = {**DEFAULTS, **(defaults or {})}
        self._mode = mode
        self._shown = dict(shown or {})  # opentelemetry: its url and bsp_* settings, shown as Triton shows them
        self._global: dict[str, Any] = {}  # fields set globally
        self._models: dict[str, dict[str, Any]] = {}  # model -> fields set for that model

    def effective(self, model: str = "") -> dict[str, Any]:
        values = {**self._defaults, **self._global}
        if model:
            values.update(self._models.get(model, {}))
        return values

    def get(self, model: str = "") -> dict[str, Any]:
        """The settings as the HTTP response shows them (every value a string, the level a list)."""
        v = self.effective(model)
        common = {"trace_level": list(v["trace_level"]), "trace_rate": str(v["trace_rate"]),
                  "trace_count": str(v["trace_count"])}
        if self._mode == "opentelemetry":  # as Triton 2.51: no file settings, the exporter's instead
            return {**common, "trace_mode": self._mode, **self._shown}
        return {**common, "log_frequency": str(v["log_frequency"]), "trace_file": v["trace_file"],
                "trace_mode": self._mode}

    def any_on(self) -> bool:
        """Whether any model may be traced now (a level other than OFF and traces left to take)."""
        top = self.effective()
        if self._mode == "triton" and not top["trace_file"]:
            return False  # nowhere to write (tritonserver starts so, and writes nothing)
        if top["trace_level"] != ("OFF",) and top["trace_count"] != 0:
            return True
        return any(self.effective(m)["trace_level"] != ("OFF",) and self.effective(m)["trace_count"] != 0
                   for m in self._models)

    def owner(self, model: str) -> str:
        """Whose settings `model` follows for sampling: its own ("model") or the global ones ("")."""
        return model if model in self._models else ""

    def count_down(self, model: str) -> None:
        """One trace taken: the remaining trace_count (where it is set) drops by one, as Triton shows it."""
        fields = self._models.get(model, {})
        target = fields if "trace_count" in fields else self._global
        current = target.get("trace_count", self._defaults["trace_count"])
        if current > 0:
            target["trace_count"] = current - 1

    def update(self, model: str, update: Mapping[str, Any]) -> None:
        """Apply `update` (key -> str | [str] | None) to `model`'s settings ("" the global ones)."""
        if "trace_file" in update:
            raise InferdError(ErrorCode.UNSUPPORTED,
                              "trace file location can not be updated through network protocol")
        changes: dict[str, Any] = {}
        if "trace_level" in update:
            level = _level(update["trace_level"])
            if level is not None:
                changes["trace_level"] = level
        for key, low in (("trace_rate", None), ("trace_count", -1), ("log_frequency", None)):
            if key in update:
                changes[key] = _number(key, update[key], low)
        target = dict(self._models.get(model, {}) if model else self._global)
        for key, value in changes.items():
            if value is _CLEAR:
                target.pop(key, None)
            else:
                target[key] = value
        merged = {**self._defaults, **(self._global if model else {}), **target}
        _check(merged, self._mode)
        if not model:
            self._global = target
        elif target:
            self._models[model] = target
        else:
            self._models.pop(model, None)


def _level(value: Any) -> Any:
    """The level a `trace_level` value sets; _CLEAR (null); or None where it sets nothing (an empty array
    or no name Triton knows: Triton leaves the level as it was)."""
    if value is None:
        return _CLEAR
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise _bad("'trace_level' must be an array of strings")
    if "OFF" in value:
        if len(value) != 1:
            raise _bad("Expect only one trace level 'OFF' is specified")
        return ("OFF",)
    chosen = tuple(name for name in _LEVELS if name in value)
    return chosen or None  # Triton ignores names it does not know


def _number(key: str, value: Any, low: int | None) -> Any:
    if value is None:
        return _CLEAR
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise _bad("expect only 1 value for '%s'" % key)
        value = value[0]
    if not isinstance(value, str):
        raise _bad("'%s' must be a string, got %r" % (key, value))
    m = _INT.match(value)
    if m is None:
        raise _bad("Unable to parse '%s', got: %s" % (key, value))
    digits = m.group().strip().lstrip("+-").lstrip("0")
    n = int(m.group()) if len(digits) <= 20 else 1 << 64  # no int() of a client's 10k digits: out of range
    if not _INT32[0] <= n <= _INT32[1]:
        bounds = "%d, %d" % (low, _INT32[1]) if low is not None else "0, %d" % _UINT32_MAX
        raise _bad("Unable to parse '%s', value is out of range [ %s ], got: %s" % (key, bounds, value))
    if low is not None:
        if n < low:
            raise _bad("Unable to parse '%s'. Expecting value >= %d, got: %s" % (key, low, value))
        return n
    return n & _UINT32_MAX  # an unsigned setting: Triton stores stoi's result in a uint32


def _check(values: dict[str, Any], mode: str = "triton") -> None:
    """Triton's rule: a setting that would trace needs a non-zero rate and a trace file."""
    if values["trace_level"] == ("OFF",):
        return
    if values["trace_rate"] == 0 and mode == "triton":  # opentelemetry: rate 0 traces propagated contexts only
        raise _bad("Attempting to set invalid trace setting :sample rate must be non-zero")
    if mode == "triton" and not values["trace_file"]:
        raise _bad("Attempting to set invalid trace setting :trace file name is not given")
