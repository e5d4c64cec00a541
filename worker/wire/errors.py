"""Error codes shared by both sides of the wire.

Numbering follows TRITONSERVER_Error_Code (pb_utils.TritonError codes 0..7); RESOURCE_EXHAUSTED
is ours, for size caps and a full /dev/shm (HTTP 413/503, gRPC RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7
    RESOURCE_EXHAUSTED = 8


class InferdError(Exception):
    """An error with a protocol-neutral code; frontends map the code to a status in one table each."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message

    def __repr__(self) -> str:
        return "InferdError(%s, %r)" % (self.code.name, self.message)


def invalid_arg(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


def unavailable(message: str) -> InferdError:
    return InferdError(ErrorCode.UNAVAILABLE, message)


def internal(message: str) -> InferdError:
    return InferdError(ErrorCode.INTERNAL, message)


def not_found(message: str) -> InferdError:
    return InferdError(ErrorCode.NOT_FOUND, message)
