"""The server log as tritonserver writes it: --log-format, --log-file, --log-info/-warning/-error.

Lines look like Triton's: `I1126 02:15:40.123456 4242 inferd.http] Started HTTPService at ...`
(severity, local date and time to the microsecond, pid, source) or, with --log-format ISO8601,
`2026-11-26T02:15:40Z I 4242 inferd.http] ...` (UTC). Verbose lines (--log-verbose) are written with
"I", as Triton does. With --log-file the process's standard output and error go to the file, so the
workers' output (they inherit both) lands there too.

--log-format json (inferd's addition) writes one JSON object per line: time (UTC, ISO 8601 to the
microsecond), severity, pid, source, message, and model, version, instance, request_id where the line is
about one (a log call's `extra`). Workers get the format at start (their bootstrap) and write their lines,
model code's pb_utils.Logger ones included, as the same objects with their model and instance.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

_SEVERITY = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}


_JSON_SEVERITY = {"I": "INFO", "W": "WARNING", "E": "ERROR"}
CONTEXT_KEYS = ("model", "version", "instance", "request_id")  # a log call's extra={...} keys kept in json


class TritonFormatter(logging.Formatter):
    def __init__(self, iso8601: bool = False) -> None:
        super().__init__()
        self.iso8601 = iso8601
        self.json = False

    def format(self, record: logging.LogRecord) -> str:
        severity = _SEVERITY.get(record.levelno, "I")
        if self.json:
            return self._json(record, severity)
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            head = f"{stamp} {severity} {record.process} {record.name}] "
        else:
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
            micros = int((record.created % 1) * 1_000_000)
            head = f"{severity}{stamp}.{micros:06d} {record.process} {record.name}] "
        text = head + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


    def _json(self, record: logging.LogRecord, severity: str) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, object] = {
            "time": "%s.%06dZ" % (stamp, int((record.created % 1) * 1_000_000)),
            "severity": _JSON_SEVERITY[severity], "pid": record.process, "source": record.name,
            "message": record.getMessage()}
        for key in CONTEXT_KEYS:
            value = record.__dict__.get(key)
            if value is not None and value != "":
                doc[key] = str(value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class LevelSwitch(logging.Filter):
    """Drops the severities turned off with --log-info/--log-warning/--log-error false."""

    def __init__(self, info: bool, warning: bool, error: bool) -> None:
        super().__init__()
        self.set(info, warning, error)

    def set(self, info: bool, warning: bool, error: bool) -> None:
        self.off = {level for level, on in ((logging.INFO, info), (logging.WARNING, warning),
                                             (logging.ERROR, error), (logging.CRITICAL, error)) if not on}

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno not in self.off


def redirect_output(path: str) -> None:
    """Standard output and error of this process (and of the workers it starts) append to `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


_formatter = TritonFormatter()
_switch = LevelSwitch(True, True, True)
_worker_levels: tuple[int, bool, bool, bool] = (0, True, True, True)


def configure(verbose: int, log_format: str = "default", log_file: str = "", info: bool = True,
              warning: bool = True, error: bool = True) -> None:
    if log_file:
        redirect_output(log_file)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter)
    handler.addFilter(_switch)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    apply(verbose, log_format, info, warning, error)


def apply(verbose: int, log_format: str, info: bool, warning: bool, error: bool) -> None:
    """Change the log settings of a running server (POST /v2/logging)."""
    _formatter.iso8601 = log_format == "ISO8601"
    _formatter.json = log_format == "json"
    global _worker_levels
    _switch.set(info, warning, error)
    logging.getLogger().setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
    _worker_levels = (int(verbose), bool(info), bool(warning), bool(error))


def worker_levels() -> tuple[int, bool, bool, bool]:
    """(verbose level, info, warning, error) as workers apply them to model logging (LogSettings)."""
    return _worker_levels


def current_format() -> str:
    """The log format now (workers started from now on write their lines in it)."""
    return "json" if _formatter.json else "ISO8601" if _formatter.iso8601 else "default"


def updated(settings: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`settings` (POST /v2/logging's keys) with `update` applied, each value checked."""
    settings = dict(settings)
    for key, value in update.items():
        if key not in settings:
            raise InferdError(ErrorCode.INVALID_ARG, "Logging setting '%s' is not supported" % key)
        if key == "log_file" and value != settings["log_file"]:
            raise InferdError(ErrorCode.UNSUPPORTED, "changing the log file over the API is not allowed")
        if key == "log_verbose_level" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise InferdError(ErrorCode.INVALID_ARG, "log_verbose_level must be a non-negative integer")
        if key in ("log_info", "log_warning", "log_error") and not isinstance(value, bool):
            raise InferdError(ErrorCode.INVALID_ARG, "%s must be a boolean" % key)
        if key == "log_format" and value not in ("default", "ISO8601", "json"):
            raise InferdError(ErrorCode.INVALID_ARG, "log_format must be 'default', 'ISO8601' or 'json'")
        settings[key] = value
    return settings
