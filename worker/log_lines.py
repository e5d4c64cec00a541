"""The worker's log lines in the server's --log-format: Triton's text lines, or with `json` one JSON object
per line (the same keys as the supervisor's, supervisor/logs.py), so the server log stays one format."""

from __future__ import annotations

import json
import os
import time

_STATE = {"json": False, "model": "", "version": "", "instance": ""}
_SEVERITY = {"I": "INFO", "W": "WARNING", "E": "ERROR"}


def configure(log_format: str = "", model: str = "", instance: str = "", version: str = "") -> None:
    """What is given changes ("" keeps the current value)."""
    if log_format:
        _STATE["json"] = log_format == "json"
    _STATE.update(model=model or _STATE["model"], instance=instance or _STATE["instance"],
                  version=version or _STATE["version"])


def is_json() -> bool:
    return bool(_STATE["json"])


def json_line(letter: str, source: str, message: str) -> str:
    now = time.time()
    doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%06dZ" % int((now % 1) * 1e6),
           "severity": _SEVERITY.get(letter, "INFO"), "pid": os.getpid(), "source": source, "message": message}
    for key in ("model", "version", "instance"):
        if _STATE[key]:
            doc[key] = _STATE[key]
    return json.dumps(doc, ensure_ascii=False) + "\n"
