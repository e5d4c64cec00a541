"""Amazon S3 and S3-compatible servers, through boto3."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import botocore.session
from botocore.config import Config

from .credentials import S3Credential
from .location import CloudLocation
from .store import CHUNK_BYTES, ObjectInfo


class S3Store:
    def __init__(self, loc: CloudLocation, cred: S3Credential, timeout_s: float) -> None:
        core = botocore.session.Session()
        if cred.credentials_file:
            core.set_config_variable("credentials_file", cred.credentials_file)
        if cred.config_file:
            core.set_config_variable("config_file", cred.config_file)
        session = boto3.session.Session(
            aws_access_key_id=cred.key_id or None, aws_secret_access_key=cred.secret_key or None,
            aws_session_token=cred.session_token or None, region_name=cred.region or None,
            profile_name=cred.profile or None, botocore_session=core)
        config = Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                        retries={"max_attempts": 2, "mode": "standard"},
                        s3={"addressing_style": "path"} if loc.endpoint else None)
        self.bucket = loc.bucket
        self.client = session.client("s3", endpoint_url=loc.endpoint or None, config=config,
                                     region_name=cred.region or ("us-east-1" if loc.endpoint else None))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", ()):
                yield ObjectInfo(obj["Key"], int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))

    def download(self, key: str, dest: str) -> None:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            with open(dest, "xb") as f:
                for chunk in body.iter_chunks(CHUNK_BYTES):  # raises when fewer bytes than announced arrive
                    f.write(chunk)
        finally:
            body.close()
