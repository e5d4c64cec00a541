"""The one table from protocol-neutral error codes to gRPC status codes (reference/triton.md §2)."""

from __future__ import annotations

import grpc
from inferd.worker.wire.errors import ErrorCode, InferdError

STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_of(error: InferdError) -> grpc.StatusCode:
    return STATUS.get(error.code, grpc.StatusCode.UNKNOWN)
