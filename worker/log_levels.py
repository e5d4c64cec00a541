"""The server's log settings as this worker applies them to model logging (pb_utils.Logger), as Triton
applies its own to the Python backend's log messages: the bootstrap's verbosity first, then what the
supervisor's LogSettings messages say (one before LoadModel, one after every POST /v2/logging).
Verbose lines need a verbose level >= 1 (whatever log_info says); info, warning and error lines need
their switch on."""

from __future__ import annotations

import threading

# pb_utils.Logger's level numbers
INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3

_lock = threading.Lock()
_verbose = 0
_switches = {INFO: True, WARNING: True, ERROR: True}


def update(verbose: int, info: bool = True, warning: bool = True, error: bool = True) -> None:
    global _verbose
    with _lock:
        _verbose = int(verbose)
        _switches.update({INFO: bool(info), WARNING: bool(warning), ERROR: bool(error)})


def set_verbose(verbose: int) -> None:
    global _verbose
    _verbose = int(verbose)


def verbose() -> int:
    return _verbose


def enabled(level: int) -> bool:
    if level == VERBOSE:
        return _verbose > 0
    return _switches.get(level, True)
