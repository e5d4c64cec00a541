"""The error type every layer raises (`InferdError`) and its codes, shared by both sides of the wire.

Why in the wire: this is the one package both processes may import. A worker's Python path holds only
`inferd.worker` (the supervisor's envs/worker_pypath.py makes it, refusing every other `inferd.*` module),
and the supervisor imports only `inferd.worker.wire` of the worker (the import-linter contract). A code
crosses the wire in `WireError` (schema.py), and the supervisor's layers raise the same `InferdError` that
its frontends map to a status in one table each (http_api/errors.py, grpc_api/errors.py), so one
definition serves both sides. Standard library only, as all of the wire (workers run on Python 3.9+).

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
