"""Google Cloud Storage, through google-cloud-storage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import google.auth
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

from .credentials import GcsCredential
from .location import CloudLocation
from .store import ObjectInfo

_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_only"]


def _from_file(path: str) -> tuple[Any, str | None]:
    """A user credential, else a service account key, as Triton tries them (its JSON "type" tells)."""
    with open(path) as f:
        info = json.load(f)
    if not isinstance(info, dict):
        raise ValueError(f"{path}: not a credential JSON object")
    if info.get("type") == "authorized_user":
        return user_credentials.Credentials.from_authorized_user_info(info, scopes=_SCOPES), info.get(
            "quota_project_id")
    return service_account.Credentials.from_service_account_info(info, scopes=_SCOPES), info.get("project_id")


class GcsStore:
    def __init__(self, loc: CloudLocation, cred: GcsCredential, timeout_s: float) -> None:
        self.timeout = timeout_s
        self.retry = DEFAULT_RETRY.with_timeout(timeout_s)  # retries of one call end within the timeout
        options: dict[str, Any] = {}
        credentials: Any
        project: str | None = None
        if cred.credentials_file:
            credentials, project = _from_file(cred.credentials_file)
        elif cred.emulator_host:
            credentials = AnonymousCredentials()
        else:
            try:  # the attached service account, as Triton; else anonymous (a public bucket)
                credentials, project = google.auth.default()
            except google.auth.exceptions.DefaultCredentialsError:
                credentials = AnonymousCredentials()
        if cred.emulator_host:
            host = cred.emulator_host
            options["api_endpoint"] = host if "://" in host else "http://" + host
        self.client = storage.Client(project=project or "inferd", credentials=credentials,
                                     client_options=options or None)
        self.bucket = self.client.bucket(loc.bucket)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for blob in self.client.list_blobs(self.bucket, prefix=prefix, timeout=self.timeout,
                                            retry=self.retry):
            mark = "%s-%s" % (blob.generation or "", blob.md5_hash or blob.etag or "")
            yield ObjectInfo(blob.name, int(blob.size or 0), mark)

    def download(self, key: str, dest: str) -> None:
        with open(dest, "xb") as f:
            self.bucket.blob(key).download_to_file(f, timeout=self.timeout, retry=self.retry)
