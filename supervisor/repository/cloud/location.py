"""Cloud repository URLs, parsed the way Triton reads them (docs/user_guide/model_repository.md):

    s3://bucket/path                       Amazon S3
    s3://host:port/bucket/path             an S3-compatible server over HTTP
    s3://https://host:port/bucket/path     ... over HTTPS (s3://http://... over HTTP, as without a scheme)
    gs://bucket/path                       Google Cloud Storage
    as://account/container/path            Azure Blob Storage (account or account.blob.core.windows.net;
                                           a ?query after the path is ignored, as Triton ignores it)

fuzz/targets/cloud_paths.py holds this to Triton's own patterns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = ("s3", "gs", "as")
# the SDK each scheme needs: (import name, pip name)
LIBRARIES = {"s3": ("boto3", "boto3"), "gs": ("google.cloud.storage", "google-cloud-storage"),
             "as": ("azure.storage.blob", "azure-storage-blob")}

_URL_RE = re.compile(r"([a-z][a-z0-9+.-]*)://(.*)", re.S)
_HOST_PORT_RE = re.compile(r"[A-Za-z0-9.\-]+:[0-9]+")  # Triton's server pattern (the port's value checked below)
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,253}")
_AZURE_HOST_SUFFIX = ".blob.core.windows.net"


@dataclass(frozen=True)
class CloudLocation:
    url: str  # as given (trailing slashes removed)
    scheme: str  # s3 | gs | as
    bucket: str  # the bucket (S3, GCS) or container (Azure)
    prefix: str  # the repository's path inside the bucket: "" or "a/b/" (always ends with "/")
    endpoint: str = ""  # S3 only: "http(s)://host:port" of a private server; "" for AWS
    account: str = ""  # Azure only: the storage account

    @property
    def bucket_url(self) -> str:
        """The URL up to the bucket (what credential-file entries are matched against, longest first)."""
        if self.scheme == "as":
            return f"as://{self.account}/{self.bucket}"
        if self.scheme == "s3" and self.endpoint:
            host = self.endpoint if self.endpoint.startswith("https://") else self.endpoint[len("http://"):]
            return f"s3://{host}/{self.bucket}"
        return f"{self.scheme}://{self.bucket}"


def is_cloud_url(text: str) -> bool:
    return _URL_RE.fullmatch(text) is not None


def parse_url(url: str) -> CloudLocation:
    """A CloudLocation; ValueError naming the problem for a URL inferd cannot read."""
    match = _URL_RE.fullmatch(url)
    if match is None:
        raise ValueError(f"{url}: not a URL")
    scheme, rest = match.group(1), match.group(2).rstrip("/")
    if scheme not in SCHEMES:
        raise ValueError(f"{url}: unknown storage scheme '{scheme}://' (expected s3://, gs:// or as://)")
    endpoint = account = ""
    if scheme == "s3":
        proto = next((p for p in ("https://", "http://") if rest.startswith(p)), "")
        rest = rest[len(proto):].lstrip("/")  # Triton drops the slashes around the path and doubled ones in it
        head = rest.split("/", 1)[0]
        if _HOST_PORT_RE.fullmatch(head):
            if int(head.rsplit(":", 1)[1]) > 65535:
                raise ValueError(f"{url}: port {head.rsplit(':', 1)[1]} is out of range")
            endpoint = (proto or "http://") + head
            rest = rest[len(head) + 1:].lstrip("/") if "/" in rest else ""
        elif proto:
            raise ValueError(f"{url}: expected s3://{proto}host:port/bucket/path")
    elif scheme == "as":
        rest = rest.split("?", 1)[0]  # Triton's pattern takes a query (a SAS token) and ignores it
        account, _, rest = rest.partition("/")
        if account.endswith(_AZURE_HOST_SUFFIX):  # as://<account>.blob.core.windows.net/...: Triton's account
            account = account[:-len(_AZURE_HOST_SUFFIX)]
        if not account:
            raise ValueError(f"{url}: expected as://account/container/path")
    bucket, _, path = rest.partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"{url}: missing or invalid bucket name {bucket!r}")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"{url}: '.' and '..' are not allowed in the path")
    prefix = "/".join(parts) + "/" if parts else ""
    return CloudLocation(url=url.rstrip("/"), scheme=scheme, bucket=bucket, prefix=prefix,
                         endpoint=endpoint, account=account)
