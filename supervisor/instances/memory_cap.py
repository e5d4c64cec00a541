"""The memory cap of a model instance's worker (--instance-memory-limit, the model's
INFERD_INSTANCE_MEMORY_LIMIT parameter): the size syntax, and the RSS watchdog that enforces it where no
cgroup can (cgroup_memory.py enforces it where one can).

The watchdog reads the worker's private resident memory (/proc/<pid>/statm: resident - shared, i.e.
RssAnon; shared-memory tensor regions and mapped files are shared with other processes and not counted)
after a batch the worker answers (at most every AFTER_BATCH_GAP_S: a look costs ~40 us) and on every
heartbeat tick: one small read, only for capped workers.
A worker found over its cap is killed and replaced under the restart policy; the batch that finished
answered already, the batches still on the worker fail with the cap's message.

Between two looks a single request could allocate far more than the cap, so RLIMIT_DATA is set on the
worker as a backstop: an allocation past it fails (MemoryError in Python) instead of taking the host. It
counts virtual private writable mappings, not resident memory, and numpy/BLAS/torch reserve a lot (measured:
a bare worker ~6 MiB, numpy 90 MiB, torch 230 MiB, plus a stack per thread), so it is set generously
(2 x cap + 1 GiB) and not at all for GPU instances (the CUDA driver maps device memory into the process).
"""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Mapping
from typing import Any

PARAMETER = "INFERD_INSTANCE_MEMORY_LIMIT"  # the model config `parameters` key (Triton ignores unknown keys)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
RLIMIT_HEADROOM = 1 << 30
AFTER_BATCH_GAP_S = 0.02  # looks after answered batches: at most 50 a second per worker (~0.2% of a core)
MAX_SIZE = 1 << 60  # 1 EiB: beyond it a size is a typo, and prlimit() overflows on it (a C long)


def parse_size(text: str) -> int | None:
    """'512M' -> bytes (K/M/G/T are powers of 1024; 'MiB', 'MB' and plain bytes too); '0', 'none' or
    '' -> None (no limit). ValueError for anything else."""
    if text.strip().lower() in ("", "0", "none", "unlimited"):
        return None
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"'{text}' is not a memory size (bytes, or a number with K, M or G: '512M')")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size < 1 << 20:
        raise ValueError(f"'{text}' is below 1 MiB: no Python worker runs in that")
    if size > MAX_SIZE:
        raise ValueError(f"'{text}' is above 1 EiB: no host has that (0 or none: no limit)")
    return size


def mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def model_limit(parameters: Mapping[str, Any], default: int | None) -> int | None:
    """The cap of a model's instances: its config's parameter when set (a string_value, '0' or 'none' for
    no cap), else the server's default. ValueError naming the parameter for a malformed value."""
    entry = parameters.get(PARAMETER)
    if entry is None:
        return default
    value = entry.get("string_value", "") if isinstance(entry, Mapping) else getattr(entry, "string_value", entry)
    try:
        return parse_size(str(value))
    except ValueError as exc:
        raise ValueError(f"parameter {PARAMETER}: {exc}") from None


def private_rss(pid: int) -> int | None:
    """Resident memory that belongs to the process alone (RssAnon), in bytes; None when unreadable."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def rlimit_data(cap: int) -> int:
    return 2 * cap + RLIMIT_HEADROOM


def set_rlimit_data(pid: int, cap: int) -> None:
    """The backstop on a (CPU) worker's data segment; best effort: a host that refuses it keeps the watchdog."""
    limit = rlimit_data(cap)
    try:
        resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))
    except (OSError, ValueError, OverflowError, AttributeError):
        pass


def exceeded(model: str, instance: str, cap: int, rss: int | None, how: str = "") -> str:
    """The error a capped worker's requests fail with, naming the cap."""
    who = f"model '{model}' instance '{instance}'" if model else f"instance '{instance}'"
    seen = f" (RSS {mib(rss)})" if rss is not None else ""
    return f"{who} exceeded its memory limit of {mib(cap)}{seen}{how}"


class RssWatch:
    """One capped worker's looks at its private RSS."""

    __slots__ = ("pid", "cap", "last", "_at")

    def __init__(self, pid: int, cap: int) -> None:
        self.pid = pid
        self.cap = cap
        self.last: int | None = None
        self._at = 0.0  # monotonic time of the last look

    def due(self) -> bool:
        """Whether a look after a batch is due (the heartbeat tick looks regardless)."""
        return time.monotonic() - self._at >= AFTER_BATCH_GAP_S

    def over(self) -> bool:
        self._at = time.monotonic()
        self.last = private_rss(self.pid)
        return self.last is not None and self.last > self.cap
