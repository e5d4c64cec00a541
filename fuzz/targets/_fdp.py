"""Structured values from fuzz bytes, read the way atheris reads them.

`provider(data)` is atheris's FuzzedDataProvider when atheris is installed, else `Provider`, a pure-Python
reader that consumes bytes exactly as atheris does for the methods below (tests/unit/fuzz/test_fdp.py holds
them to it): a finding saved by a coverage-guided run replays the same way on a machine without atheris.

Bytes and bools come from the front of the data, integers from the back (libFuzzer's convention: lengths
and choices stay put while a mutation grows or shrinks the payload in front).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class FDP(Protocol):
    """The methods targets may use (a subset of atheris.FuzzedDataProvider)."""

    def remaining_bytes(self) -> int: ...
    def ConsumeBytes(self, count: int) -> bytes: ...  # noqa: N802 (atheris's names)
    def ConsumeBool(self) -> bool: ...  # noqa: N802
    def ConsumeIntInRange(self, lo: int, hi: int) -> int: ...  # noqa: N802
    def PickValueInList(self, values: Sequence[Any]) -> Any: ...  # noqa: N802


class Provider:
    """atheris.FuzzedDataProvider's reading of `data`, for the methods in FDP."""

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self._lo = 0  # next byte from the front
        self._hi = len(self._data)  # one past the next byte from the back

    def remaining_bytes(self) -> int:
        return self._hi - self._lo

    def ConsumeBytes(self, count: int) -> bytes:  # noqa: N802
        if count < 0:
            raise TypeError("ConsumeBytes(): the count must be non-negative")
        end = min(self._hi, self._lo + count)
        out = self._data[self._lo:end]
        self._lo = end
        return out

    def ConsumeBool(self) -> bool:  # noqa: N802
        if self._lo >= self._hi:
            return False
        self._lo += 1
        return bool(self._data[self._lo - 1] & 1)

    def ConsumeIntInRange(self, lo: int, hi: int) -> int:  # noqa: N802
        if lo > hi:
            raise RuntimeError(f"ConsumeIntInRange: min must be <= max (got min={lo}, max={hi})")
        span = hi - lo
        if span >= 1 << 64:
            raise ValueError("ConsumeIntInRange: ranges wider than 64 bits are not supported here")
        result = 0
        shift = 0
        # big-endian from the back, as many bytes as the range needs, fewer when the data runs out
        while shift < 64 and span >> shift and self._hi > self._lo:
            self._hi -= 1
            result = (result << 8) | self._data[self._hi]
            shift += 8
        if span != (1 << 64) - 1:
            result %= span + 1
        return lo + result

    def PickValueInList(self, values: Sequence[T]) -> T:  # noqa: N802
        if not values:
            raise IndexError("list index out of range")
        return values[self.ConsumeIntInRange(0, len(values) - 1)]


try:  # the C reader when there is one (faster); the same values either way
    from atheris import FuzzedDataProvider as _Native
except ImportError:  # pragma: no cover - atheris is a dev dependency, absent on some Pythons
    _Native = None


def provider(data: bytes) -> FDP:
    """A reader over `data`: atheris's when installed, else Provider."""
    return _Native(data) if _Native is not None else Provider(data)  # type: ignore[no-any-return]
