"""Cloud repository URLs (supervisor/repository/cloud/location.py) against Triton's own reading of them.

Reference: Triton's parsing, rewritten here from its patterns (triton-inference-server/core,
src/filesystem/implementations/{s3,gcs,as}.h and api.cc), not from its code:
- the scheme is a literal prefix "gs://", "s3://" or "as://" (anything else is a local path);
- s3: the text after "s3://" loses an "https://" or "http://" in front, its leading and trailing slashes,
  and runs of slashes inside; then `s3://(http://|https://|)HOST:PORT/BUCKET(/SEGMENT)*` (HOST of
  [0-9a-zA-Z-.], PORT digits, BUCKET of [0-9a-z.-], SEGMENTs of [0-9a-zA-Z.-_]) names a server, a bucket and
  a path; otherwise the bucket is what lies before the first slash and the path what follows it;
- gs: the bucket is what lies between "gs://" and the next slash, the path everything after that slash;
- as: `as://ACCOUNT/CONTAINER[/PATH][?QUERY]` (ACCOUNT and CONTAINER without "/", CONTAINER and PATH without
  "?"; the query is ignored); an ACCOUNT ending in ".blob.core.windows.net" names the account before it.

Invariants:
- `parse_url` raises nothing but ValueError; `is_cloud_url` nothing at all.
- Where Triton's reading is one a store can serve (a bucket or container name valid for that store, a valid
  Azure account, a port up to 65535, a path without "." or ".." segments, which inferd refuses on purpose:
  they would leave the local snapshot), inferd reads the same bucket, path, server and account.
- Where inferd accepts a URL that Triton reads differently, Triton's reading is one no store can serve
  (a path of characters outside Triton's server pattern makes Triton take "host:port" for the bucket).

Data: one mode byte, then
- 0: the URL as UTF-8 text (errors replaced): seeds are the forms of Triton's documentation;
- 1: a URL assembled from the bytes: scheme, "http(s)://", host:port, account suffix, bucket and path
  segments drawn from valid and invalid names, slashes doubled, "." / "..", a query, odd characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from _fdp import FDP, provider
from inferd.supervisor.repository.cloud import location


class Finding(AssertionError):
    pass


@dataclass(frozen=True)
class Reading:
    scheme: str
    bucket: str
    path: str  # "" or "a/b" (no slash at either end)
    endpoint: str = ""  # s3: "http://host:port" or "https://host:port"
    account: str = ""  # as
    usable: bool = True  # a store could serve it (see the module docstring)


_S3_SERVER = re.compile(r"s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)((/[0-9a-zA-Z.\-_]+)*)")
_AS_URL = re.compile(r"as://([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)?", re.S)
_S3_BUCKET = re.compile(r"(?!.*\.\.)[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]")
_AZ_CONTAINER = re.compile(r"[a-z0-9](?!.*--)[a-z0-9\-]{1,61}[a-z0-9]")
_AZ_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_AZ_SUFFIX = ".blob.core.windows.net"


def _path_usable(path: str) -> bool:
    parts = path.split("/")
    return all(p and p not in (".", "..") for p in parts) if path else True


def _gcs_bucket_ok(name: str) -> bool:
    return bool(_GCS_BUCKET.fullmatch(name)) and (len(name) <= 63 or all(len(p) <= 63 for p in name.split(".")))


OUTSIDE = Reading("", "", "", usable=False)  # what Triton makes of it serves no one: nothing to compare


def triton(url: str) -> Reading | None:
    """Triton's reading of `url`; None where it refuses it (or would not take it for a cloud URL)."""
    if url.startswith("gs://"):
        rest = url[5:]
        bucket, sep, obj = rest.partition("/")
        if not bucket:
            return None
        path = obj[:-1] if obj.endswith("/") else obj  # AppendSlash: "a/" and "a" list the same prefix
        return Reading("gs", bucket, path, usable=_gcs_bucket_ok(bucket) and _path_usable(path))
    if url.startswith("s3://"):
        rest, front = url[5:], ""
        for proto in ("https://", "http://"):
            at = rest.find(proto)
            if at >= 0:
                if at > 0:
                    return OUTSIDE  # Triton cuts at an "http(s)://" found anywhere: a reading of no use
                rest, front = rest[len(proto):], proto
                break
        core = re.sub("/+", "/", rest.strip("/"))
        if not core:
            return None
        clean = "s3://" + front + core
        m = _S3_SERVER.fullmatch(clean)
        if m:
            proto, host, port, bucket, obj = m.group(1) or "http://", m.group(2), m.group(3), m.group(4), m.group(5)
            path = obj[1:]
            usable = int(port) <= 65535 and bool(_S3_BUCKET.fullmatch(bucket)) and _path_usable(path)
            return Reading("s3", bucket, path, endpoint=proto + host + ":" + port, usable=usable)
        if front:
            return Reading("s3", front.rstrip("/"), core, usable=False)  # the fallback takes "http:" for the bucket
        bucket, _, path = core.partition("/")
        return Reading("s3", bucket, path, usable=bool(_S3_BUCKET.fullmatch(bucket)) and _path_usable(path))
    if url.startswith("as://"):
        m = _AS_URL.fullmatch(url)
        if m is None:
            return None
        host, container, blob = m.group(1), m.group(2), m.group(3) or ""
        cut = host.rfind(_AZ_SUFFIX)
        account = host[:cut] if cut >= 0 else host
        path = blob[:-1] if blob.endswith("/") else blob
        usable = (bool(_AZ_ACCOUNT.fullmatch(account)) and (cut < 0 or cut + len(_AZ_SUFFIX) == len(host))
                  and bool(_AZ_CONTAINER.fullmatch(container)) and _path_usable(path))
        return Reading("as", container, path, account=account, usable=usable)
    return None


def inferd(url: str) -> Reading | None:
    try:
        loc = location.parse_url(url)
    except ValueError:
        return None
    return Reading(loc.scheme, loc.bucket, loc.prefix.rstrip("/"), loc.endpoint, loc.account)


def check(url: str) -> None:
    location.is_cloud_url(url)
    want, got = triton(url), inferd(url)
    if want is OUTSIDE:
        return
    if want is not None and want.usable:
        expect = Reading(want.scheme, want.bucket, want.path, want.endpoint, want.account)
        if got != expect:
            raise Finding(f"{url!r}: inferd reads {got}, Triton {expect}")
    elif want is None and got is not None:
        raise Finding(f"{url!r}: inferd reads {got}, Triton refuses it")


# ---- URLs from the bytes --------------------------------------------------------------------------------

_SCHEMES = ["s3://", "gs://", "as://", "S3://", "s3:/", "http://", "file://", "s3:", ""]
_PROTOS = ["", "", "http://", "https://", "HTTP://", "https:/"]
_HOSTS = ["localhost:9000", "127.0.0.1:443", "minio.local:9", "host:123456", "host:65536", "h_st:80", ":80",
          "host:", "[::1]:9000"]
_BUCKETS = ["models", "my-bucket", "a.b.c", "ab", "x" * 64, "Models", "my_bucket", "-bad", "bad-", "b..c", "",
            "a--b", "acct", "my bucket", "b%20c", "é"]
_ACCOUNTS = ["acct", "acct.blob.core.windows.net", "ACCT", "acct.blob.core.windows.net.evil", "a", "myaccount1"]
_SEGMENTS = ["repo", "a", "1", "v1.0", "x_y", "..", ".", "", "a b", "%2e%2e", "é", "a?b", "#", "a:b", "~", "*"]


def built(fdp: FDP) -> str:
    scheme = fdp.PickValueInList(_SCHEMES)
    parts = [scheme]
    if scheme.startswith(("s3", "S3")):
        if fdp.ConsumeBool():
            parts.append(fdp.PickValueInList(_PROTOS))
            parts.append(fdp.PickValueInList(_HOSTS) + "/" * fdp.ConsumeIntInRange(1, 2))
    elif scheme.startswith("as"):
        parts.append(fdp.PickValueInList(_ACCOUNTS) + "/")
    if fdp.ConsumeIntInRange(0, 5) == 0:
        parts.append("/")
    parts.append(fdp.PickValueInList(_BUCKETS))
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        parts.append("/" * fdp.ConsumeIntInRange(1, 2) + fdp.PickValueInList(_SEGMENTS))
    if fdp.ConsumeIntInRange(0, 3) == 0:
        parts.append("/")
    if fdp.ConsumeIntInRange(0, 5) == 0:
        parts.append("?sv=2024&sig=x/y")
    url = "".join(parts)
    if fdp.ConsumeIntInRange(0, 4) == 0 and url:  # one character changed
        at = fdp.ConsumeIntInRange(0, len(url) - 1)
        url = url[:at] + fdp.PickValueInList(["/", ":", "\x00", "\n", " ", "A", "?", "é", "\udcff"]) + url[at + 1:]
    return url


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] % 2 == 0:
        check(data[1:].decode("utf-8", "replace"))
    else:
        check(built(provider(data[1:])))
