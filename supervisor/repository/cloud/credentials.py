"""Which credentials a cloud repository is read with, by Triton's rules (model_repository.md):

- TRITON_CLOUD_CREDENTIAL_PATH: a JSON file {"s3": {...}, "gs": {...}, "as": {...}}, each mapping a URL
  prefix ("" matches everything) to a credential; the longest prefix matching the repository URL wins.
  A repository no entry matches falls back to the environment.
- S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION (or AWS_REGION),
  AWS_PROFILE; otherwise boto3's own chain (the shared credential file ~/.aws/credentials, named by
  AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE, then instance metadata).
- GCS: GOOGLE_APPLICATION_CREDENTIALS (a credential JSON file); otherwise the attached service account,
  otherwise anonymous (a public bucket). STORAGE_EMULATOR_HOST points the client at an emulator.
- Azure: AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY (shared key); AZURE_STORAGE_CONNECTION_STRING
  may name the blob endpoint (e.g. Azurite) and key.

Nothing here reads the environment: supervisor/flags.py hands over the variables it read
(`ENV_VARS`) once, at start-up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .location import CloudLocation

CREDENTIAL_PATH_ENV = "TRITON_CLOUD_CREDENTIAL_PATH"
ENV_VARS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION",
    "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST",
    "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
    CREDENTIAL_PATH_ENV,
)
MAX_CREDENTIAL_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class S3Credential:
    key_id: str = ""
    secret_key: str = field(default="", repr=False)
    session_token: str = field(default="", repr=False)
    region: str = ""
    profile: str = ""
    credentials_file: str = ""  # AWS_SHARED_CREDENTIALS_FILE
    config_file: str = ""  # AWS_CONFIG_FILE


@dataclass(frozen=True)
class GcsCredential:
    credentials_file: str = ""  # "" = the attached service account, else anonymous
    emulator_host: str = ""  # STORAGE_EMULATOR_HOST: "http://host:port"


@dataclass(frozen=True)
class AzureCredential:
    account: str
    key: str = field(default="", repr=False)
    endpoint: str = ""  # "" = https://<account>.blob.core.windows.net


@dataclass(frozen=True)
class CloudCredentials:
    """What flags.py read: the cloud variables of the environment and the parsed credential file."""

    env: tuple[tuple[str, str], ...] = ()
    file: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # (scheme, ((prefix, entry), ...))

    def __repr__(self) -> str:  # secrets stay out of logs and tracebacks
        return "CloudCredentials(env=%s, file=%s)" % ([k for k, _ in self.env], [s for s, _ in self.file])

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CloudCredentials:
        """Called by flags.py only. ValueError for an unreadable or malformed credential file."""
        env = tuple((k, environ[k]) for k in ENV_VARS if environ.get(k))
        path = dict(env).get(CREDENTIAL_PATH_ENV, "")
        return cls(env=env, file=_read_credential_file(path) if path else ())

    def _env(self, name: str) -> str:
        return dict(self.env).get(name, "")

    def _file_entry(self, loc: CloudLocation) -> Any:
        entries = dict(self.file).get(loc.scheme, ())
        best: tuple[int, Any] | None = None
        for prefix, entry in entries:
            if loc.url.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), entry)
        return None if best is None else best[1]

    def for_location(self, loc: CloudLocation) -> S3Credential | GcsCredential | AzureCredential:
        entry = self._file_entry(loc)
        if loc.scheme == "s3":
            files = {"credentials_file": self._env("AWS_SHARED_CREDENTIALS_FILE"),
                     "config_file": self._env("AWS_CONFIG_FILE")}
            if entry is not None:
                return S3Credential(key_id=entry.get("key_id", ""), secret_key=entry.get("secret_key", ""),
                                    session_token=entry.get("session_token", ""), region=entry.get("region", ""),
                                    profile=entry.get("profile", ""), **files)
            return S3Credential(key_id=self._env("AWS_ACCESS_KEY_ID"), secret_key=self._env("AWS_SECRET_ACCESS_KEY"),
                                session_token=self._env("AWS_SESSION_TOKEN"),
                                region=self._env("AWS_DEFAULT_REGION") or self._env("AWS_REGION"),
                                profile=self._env("AWS_PROFILE"), **files)
        if loc.scheme == "gs":
            path = entry if isinstance(entry, str) else self._env("GOOGLE_APPLICATION_CREDENTIALS")
            return GcsCredential(credentials_file=path, emulator_host=self._env("STORAGE_EMULATOR_HOST"))
        conn = parse_connection_string(self._env("AZURE_STORAGE_CONNECTION_STRING"))
        endpoint = conn.get("BlobEndpoint", "").rstrip("/")
        if not endpoint and conn.get("AccountName") == loc.account and conn.get("EndpointSuffix"):
            endpoint = "%s://%s.blob.%s" % (conn.get("DefaultEndpointsProtocol", "https"), loc.account,
                                            conn["EndpointSuffix"])
        if entry is not None:
            if entry.get("auth_type", "") not in ("", "key", "shared_key"):
                raise ValueError(f"{loc.url}: Azure auth_type {entry['auth_type']!r} is not supported "
                                 "(shared key only)")
            key = entry.get("account_key", "")
        else:
            key = self._env("AZURE_STORAGE_KEY") or (
                conn.get("AccountKey", "") if conn.get("AccountName", loc.account) == loc.account else "")
        return AzureCredential(account=loc.account, key=key, endpoint=endpoint)


def parse_connection_string(text: str) -> dict[str, str]:
    """'Key=Value;Key=Value' (an Azure storage connection string) as a dict."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _read_credential_file(path: str) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CREDENTIAL_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{CREDENTIAL_PATH_ENV}={path}: {e.strerror or e}") from e
    if len(data) > MAX_CREDENTIAL_FILE_BYTES:
        raise ValueError(f"{CREDENTIAL_PATH_ENV}={path}: larger than {MAX_CREDENTIAL_FILE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{CREDENTIAL_PATH_ENV}={path}: not valid JSON ({e})") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{CREDENTIAL_PATH_ENV}={path}: expected a JSON object")
    out = []
    for scheme, entries in doc.items():
        if scheme not in ("s3", "gs", "as") or not isinstance(entries, dict):
            raise ValueError(f"{CREDENTIAL_PATH_ENV}={path}: expected {{\"s3\"|\"gs\"|\"as\": {{prefix: "
                             f"credential}}}}, found {scheme!r}")
        for prefix, entry in entries.items():
            expected = str if scheme == "gs" else dict
            if not isinstance(entry, expected) or (
                    isinstance(entry, dict) and not all(isinstance(v, str) for v in entry.values())):
                raise ValueError(f"{CREDENTIAL_PATH_ENV}={path}: the {scheme!r} entry {prefix!r} must be "
                                 + ("a file path" if scheme == "gs" else "an object of strings"))
        out.append((scheme, tuple(entries.items())))
    return tuple(out)
