"""Azure Blob Storage, through azure-storage-blob (shared key, or anonymous without one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from azure.storage.blob import BlobServiceClient, LinearRetry

from .credentials import AzureCredential
from .location import CloudLocation
from .store import ObjectInfo


class AzureStore:
    def __init__(self, loc: CloudLocation, cred: AzureCredential, timeout_s: float) -> None:
        url = cred.endpoint or f"https://{cred.account}.blob.core.windows.net"
        key: Any = {"account_name": cred.account, "account_key": cred.key} if cred.key else None
        self.timeout = timeout_s
        # two retries a second apart (the SDK's default waits 15 s and more between tries)
        retry = LinearRetry(backoff=1, retry_total=2, random_jitter_range=1)
        service = BlobServiceClient(account_url=url, credential=key, connection_timeout=timeout_s,
                                    read_timeout=timeout_s, retry_policy=retry)
        self.container = service.get_container_client(loc.bucket)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for blob in self.container.list_blobs(name_starts_with=prefix, timeout=int(self.timeout) or 1):
            yield ObjectInfo(blob.name, int(blob.size), str(blob.etag or "").strip('"'))

    def download(self, key: str, dest: str) -> None:
        stream = self.container.download_blob(key, max_concurrency=1, timeout=int(self.timeout) or 1)
        with open(dest, "xb") as f:
            stream.readinto(f)
