"""Recycling of a model instance's worker (gunicorn's max_requests / max_age): after so many requests or so
long, the instance's worker is replaced by a fresh one in a rolling way (Instance.recycle): the replacement
starts and becomes ready while the old worker keeps serving; then new batches go to the replacement and
the old one drains and stops. Python models that leak (memory, file handles, threads) thus never fail a
request for it.

Settings: the server's --instance-max-requests / --instance-max-age, or the model's `parameters`
INFERD_MAX_REQUESTS / INFERD_MAX_AGE (Triton ignores unknown parameters, so the config stays valid for it).
Each worker's threshold is spread by up to SPREAD above the setting, so that a model's instances, started
together, do not all recycle at once.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping
from typing import Any

from inferd.supervisor.config import WorkerTimings

MAX_REQUESTS = "INFERD_MAX_REQUESTS"  # model config `parameters` keys
MAX_AGE = "INFERD_MAX_AGE"
SPREAD = 0.1  # a worker's threshold: setting x (1 + up to 10%)
RETIRE_TIMEOUT_S = 60.0  # the longest a replaced worker is given to answer what it holds before it is stopped
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", re.IGNORECASE)
_AGE_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_requests(text: str) -> int | None:
    """'10000' -> 10000; '0', 'none' or '' -> None (never). ValueError for anything else."""
    text = text.strip()
    if text.lower() in ("", "0", "none"):
        return None
    if not text.isdigit():
        raise ValueError(f"'{text}' is not a request count (a whole number; 0 or none: never)")
    return int(text)


def parse_age(text: str) -> float | None:
    """Seconds: '3600', '90s', '30m', '12h', '500ms'; '0', 'none' or '' -> None (never). ValueError otherwise."""
    if text.strip().lower() in ("", "0", "none"):
        return None
    match = _AGE.fullmatch(text)
    if match is None:
        raise ValueError(f"'{text}' is not an age (seconds, or a number with ms, s, m or h: '30m')")
    age = float(match.group(1)) * _AGE_UNITS[(match.group(2) or "s").lower()]
    if age < 0.1:
        raise ValueError(f"'{text}' is below 100 ms: a worker would do nothing but start")
    return age


def _string(entry: Any) -> str:
    if isinstance(entry, Mapping):
        return str(entry.get("string_value", ""))
    return str(getattr(entry, "string_value", entry))


def model_timings(parameters: Mapping[str, Any], timings: WorkerTimings) -> WorkerTimings:
    """`timings` with the model's INFERD_MAX_REQUESTS / INFERD_MAX_AGE over the server's defaults (the same
    object when the model sets neither). ValueError naming the parameter for a malformed value."""
    changes: dict[str, Any] = {}
    for key, field, parse in ((MAX_REQUESTS, "max_requests", parse_requests), (MAX_AGE, "max_age_s", parse_age)):
        entry = parameters.get(key)
        if entry is None:
            continue
        try:
            changes[field] = parse(_string(entry))
        except ValueError as exc:
            raise ValueError(f"parameter {key}: {exc}") from None
    return dataclasses.replace(timings, **changes) if changes else timings


def spread(value: float) -> float:
    """A worker's own threshold: the setting plus up to SPREAD of it."""
    return value * (1.0 + random.uniform(0.0, SPREAD))
