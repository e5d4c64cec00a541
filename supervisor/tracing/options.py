"""--trace-config (and the deprecated --trace-file/-level/-rate/-count/-log-frequency) as tritonserver 2.51
reads them: `<setting>=<value>` for the global settings (rate, level, count, mode), `triton,<setting>=<value>`
(file, log-frequency) and `opentelemetry,<setting>=<value>` (url, resource, bsp_*)."""

from __future__ import annotations

from dataclasses import dataclass

OTEL_DEFAULT_URL = "http://localhost:4318/v1/traces"
LEVELS = ("TIMESTAMPS", "TENSORS")
# tritonserver reads a level in any case, with these aliases (command_line_parser.cc, ParseTraceLevelOption)
_LEVEL_ALIASES = {"false": "OFF", "off": "OFF", "true": "TIMESTAMPS", "on": "TIMESTAMPS", "min": "TIMESTAMPS",
                  "max": "TIMESTAMPS", "timestamps": "TIMESTAMPS", "tensors": "TENSORS"}


def _level(value: str) -> str:
    text = value.strip()
    return _LEVEL_ALIASES.get(text.lower(), text.upper())


@dataclass(frozen=True)
class TraceOptions:
    mode: str = "triton"  # triton | opentelemetry
    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    file: str = ""
    log_frequency: int = 0
    otel_url: str = OTEL_DEFAULT_URL
    otel_resource: tuple[tuple[str, str], ...] = (("service.name", "triton-inference-server"),)
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512


def _int(flag: str, value: str, low: int) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError(f"{flag}: expected an integer, got {value!r}") from None
    if n < low:
        raise ValueError(f"{flag}: expected a value >= {low}, got {n}")
    return n


def parse(trace_config: list[str], file: list[str] | None = None, level: list[str] | None = None,
          rate: list[str] | None = None, count: list[str] | None = None,
          log_frequency: list[str] | None = None) -> TraceOptions:
    """The options from the flags' values (the last of a setting wins, levels accumulate). ValueError
    naming the flag and value that cannot be read."""
    v: dict[str, object] = {}
    levels: list[str] = []
    resource: dict[str, str] = {}
    for value in level or ():
        levels.append(_level(value))
    for value in file or ():
        v["file"] = value
    for value in rate or ():
        v["rate"] = _int("--trace-rate", value, 0)
    for value in count or ():
        v["count"] = _int("--trace-count", value, -1)
    for value in log_frequency or ():
        v["log_frequency"] = _int("--trace-log-frequency", value, 0)
    for item in trace_config:
        flag = f"--trace-config {item}"
        mode, sep, rest = item.partition(",")
        if not sep or "=" in mode:
            mode, rest = "", item
        mode = mode.lower()  # tritonserver reads the mode in any case
        key, eq, value = rest.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"{flag}: expected [<mode>,]<setting>=<value>")
        if mode == "":
            if key == "rate":
                v["rate"] = _int(flag, value, 0)
            elif key == "count":
                v["count"] = _int(flag, value, -1)
            elif key == "level":
                levels.append(_level(value))
            elif key == "mode":
                if value.lower() not in ("triton", "opentelemetry"):
                    raise ValueError(f"{flag}: the mode is triton or opentelemetry")
                v["mode"] = value.lower()
            else:
                raise ValueError(f"{flag}: unknown global trace setting '{key}' (rate, level, count, mode)")
        elif mode == "triton":
            if key == "file":
                v["file"] = value
            elif key == "log-frequency":
                v["log_frequency"] = _int(flag, value, 0)
            else:
                raise ValueError(f"{flag}: unknown triton trace setting '{key}' (file, log-frequency)")
        elif mode == "opentelemetry":
            if key == "url":
                v["otel_url"] = value  # shown as given; http:// is assumed where no scheme is named
            elif key == "resource":
                rkey, req, rvalue = value.partition("=")
                if not req or not rkey.strip():
                    raise ValueError(f"{flag}: expected resource=<key>=<value>")
                resource[rkey.strip()] = rvalue
            elif key in ("bsp_max_queue_size", "bsp_max_export_batch_size"):
                v[key] = _int(flag, value, 1)
            elif key == "bsp_schedule_delay":
                v["bsp_schedule_delay_ms"] = _int(flag, value, 0)
            else:
                raise ValueError(f"{flag}: unknown opentelemetry trace setting '{key}' "
                                 "(url, resource, bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)")
        else:
            raise ValueError(f"{flag}: unknown trace mode '{mode}' (triton or opentelemetry)")
    if levels:
        bad = [name for name in levels if name not in LEVELS + ("OFF",)]
        if bad:
            raise ValueError(f"trace level {bad[0]}: expected OFF, TIMESTAMPS or TENSORS "
                             "(or false, off, true, on, min, max in any case)")
        chosen = tuple(name for name in LEVELS if name in levels)
        v["level"] = chosen or ("OFF",)
    if resource:
        base = dict(TraceOptions().otel_resource)
        base.update(resource)
        v["otel_resource"] = tuple(base.items())
    opts = TraceOptions(**v)  # type: ignore[arg-type]
    if opts.bsp_max_export_batch_size > opts.bsp_max_queue_size:
        raise ValueError("--trace-config opentelemetry,bsp_max_export_batch_size must not exceed bsp_max_queue_size")
    if opts.mode == "opentelemetry" and "TENSORS" in opts.level:
        raise ValueError("--trace-config level=TENSORS: the opentelemetry mode does not support the TENSORS level")
    return opts
