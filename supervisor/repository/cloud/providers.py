"""The factory that imports a provider only when a repository of its scheme is named."""

from __future__ import annotations

from .credentials import CloudCredentials
from .location import CloudLocation
from .store import Store


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
