"""What fuzz/targets/cloud_paths.py found where inferd read a cloud URL otherwise than Triton (the inputs are
in its corpus)."""

from __future__ import annotations

import pytest
from inferd.supervisor.repository.cloud.location import parse_url


def reading(url: str) -> tuple[str, str, str, str, str]:
    loc = parse_url(url)
    return loc.scheme, loc.endpoint, loc.bucket, loc.prefix, loc.account


def test_s3_over_plain_http_named_by_its_scheme():
    """Triton's server pattern takes "http://" as it takes "https://" (issue 43 #7): inferd refused it."""
    assert reading("s3://http://127.0.0.1:9000/bucket/models") == ("s3", "http://127.0.0.1:9000", "bucket",
                                                                    "models/", "")


def test_s3_slashes_around_and_inside_the_path_are_dropped_as_triton_drops_them():
    """Triton trims and folds the slashes of an s3 path before reading it: inferd found no bucket."""
    assert reading("s3:///bucket//models/") == ("s3", "", "bucket", "models/", "")
    assert reading("s3://host:9000//bucket///models") == ("s3", "http://host:9000", "bucket", "models/", "")


def test_azure_account_given_as_its_blob_host_name():
    """as://acct.blob.core.windows.net/...: Triton's account is "acct"; inferd's was the whole host name
    (and the client went to https://acct.blob.core.windows.net.blob.core.windows.net)."""
    assert reading("as://acct.blob.core.windows.net/models/repo") == ("as", "", "models", "repo/", "acct")


def test_azure_query_is_ignored_as_triton_ignores_it():
    """A SAS-style query after the path: inferd took it into the prefix (or the container name)."""
    assert reading("as://acct/models/repo?sv=2024-01-01&sig=x/y") == ("as", "", "models", "repo/", "acct")
    assert reading("as://acct/models?sv=1") == ("as", "", "models", "", "acct")


def test_s3_server_port_with_leading_zeros():
    """Triton's server pattern takes any run of digits for the port: inferd took at most five, and read
    "s3://host:009000/bucket" as a bucket named "host:009000"."""
    assert reading("s3://host:009000/bucket/m") == ("s3", "http://host:009000", "bucket", "m/", "")
    with pytest.raises(ValueError, match="port 65536 is out of range"):
        parse_url("s3://host:65536/bucket")
