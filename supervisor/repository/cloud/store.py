"""The one interface every provider implements, and the factory that imports a provider only when a
repository of its scheme is named."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from .credentials import CloudCredentials
from .location import CloudLocation

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


def open_store(loc: CloudLocation, creds: CloudCredentials, timeout_s: float) -> Store:
    cred = creds.for_location(loc)
    if loc.scheme == "s3":
        from .s3 import S3Store

        return S3Store(loc, cred, timeout_s)  # type: ignore[arg-type]
    if loc.scheme == "gs":
        from .gcs import GcsStore

        return GcsStore(loc, cred, timeout_s)  # type: ignore[arg-type]
    from .azure import AzureStore

    return AzureStore(loc, cred, timeout_s)  # type: ignore[arg-type]
