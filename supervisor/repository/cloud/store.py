"""The one interface every provider implements (providers.py picks one per scheme)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # the full object key inside the bucket
    size: int
    etag: str  # changes whenever the content does (S3/Azure ETag, GCS generation + md5)


class Store(Protocol):
    """Blocking calls, each bounded by the provider's connect/read timeouts; run them off the event loop."""

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (recursive)."""
        ...

    def download(self, key: str, dest: str) -> None:
        """Write the object's bytes to the new file `dest`."""
        ...
