"""Model repositories in cloud object stores (s3://, gs://, as://), as Triton names them.

This package holds the parts with no storage SDK in them: URL parsing (`location`), credentials
(`credentials`), the local snapshot cache (`snapshot_cache`). The provider modules (`s3`, `gcs`, `azure`) import
their SDK (the `inferd[cloud]` extra) and are imported only when a repository of theirs is named.
"""

from __future__ import annotations

from .location import CloudLocation, is_cloud_url, parse_url

__all__ = ["CloudLocation", "is_cloud_url", "parse_url"]
