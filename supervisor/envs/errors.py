"""The one error of the envs package (its own module so that unpack.py and extract.py share it without a cycle)."""

from __future__ import annotations

from inferd.worker.wire.errors import ErrorCode, InferdError


class EnvError(InferdError):
    """An environment that cannot be used; the message names the cause and the path."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)
