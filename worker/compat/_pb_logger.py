"""pb_utils.Logger: log lines in the server's --log-format (Triton's text, or JSON) on the worker's stderr,
filtered by the server's log settings as they are now (worker/log_levels.py)."""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
from typing import Any

from .. import log_levels as _log_levels
from .. import log_lines as _log_lines
from .. import pb_args as _args
from ._pb_base import _state

_log_lock = threading.Lock()


class LogLevel(enum.IntEnum):
    """`pb_utils.Logger.LogLevel`: Logger.log takes one of these, never a plain int (as python_backend)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


def _log_message(message: Any, function: str, signature: str, args: tuple) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, (bytes, bytearray)):  # Triton's std::string: the text, not b'...'
        return bytes(message).decode("utf-8", "replace")
    raise _args.incompatible(function, signature, args)


_LOG_SIGNATURE = "(message: str, level: triton_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"


class Logger:
    """Log lines in the server's --log-format (Triton's text lines, or JSON) on stderr, which the supervisor
    gathers into the server log (or on the stream `_configure` was given)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LETTER = {0: "I", 1: "W", 2: "E", 3: "I"}

    @staticmethod
    def log(message: Any, level: Any = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):
            raise _args.incompatible("log", _LOG_SIGNATURE, (message, level))
        Logger._emit(_log_message(message, "log", _LOG_SIGNATURE, (message, level)), level, 2)

    @staticmethod
    def log_info(message: Any) -> None:
        Logger._emit(_log_message(message, "log_info", "(message: str) -> None", (message,)), Logger.INFO, 2)

    @staticmethod
    def log_warn(message: Any) -> None:
        Logger._emit(_log_message(message, "log_warn", "(message: str) -> None", (message,)), Logger.WARNING, 2)

    @staticmethod
    def log_error(message: Any) -> None:
        Logger._emit(_log_message(message, "log_error", "(message: str) -> None", (message,)), Logger.ERROR, 2)

    @staticmethod
    def log_verbose(message: Any) -> None:
        Logger._emit(_log_message(message, "log_verbose", "(message: str) -> None", (message,)),
                     Logger.VERBOSE, 2)

    @staticmethod
    def _emit(message: Any, level: int, depth: int) -> None:
        level = int(level)
        if isinstance(message, (bytes, bytearray)):  # Triton's std::string: the text, not b'...'
            message = bytes(message).decode("utf-8", "replace")
        if not _log_levels.enabled(level):  # the server's settings, also as changed at run time
            return
        try:
            frame = sys._getframe(depth)
            where = "%s:%d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
        except ValueError:
            where = "?"
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + ".%06d" % int((now % 1) * 1e6)
        line = "%s%s %d %s] %s\n" % (Logger._LETTER.get(level, "I"), stamp, os.getpid(), where, message)
        if _log_lines.is_json():
            line = _log_lines.json_line(Logger._LETTER.get(level, "I"), where, str(message))
        stream = _state["stream"] or sys.stderr
        with _log_lock:
            try:
                stream.write(line)
                stream.flush()
            except (OSError, ValueError):
                pass

