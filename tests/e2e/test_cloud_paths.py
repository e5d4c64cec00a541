"""Cloud repository paths in the forms Triton's docs give (issue 43 item 7), served from moto's S3 server:
`s3://http://host:port/bucket/path` (Triton's S3 path pattern allows the scheme before a custom endpoint:
a MinIO setup written for Triton; inferd stopped with "missing or invalid bucket name 'http:'"), and the
slashes Triton drops around and inside the path. The parser itself is held to Triton's patterns by
fuzz/targets/cloud_paths.py (gs:// and as:// forms too) and tests/unit/repository/test_cloud_paths_fuzz_findings.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).parent))
import cloud_stores as cs  # noqa: E402

pytest.importorskip("boto3")
pytest.importorskip("moto")
pytestmark = pytest.mark.inferd_only  # (--cloud-cache-dir; the reference Triton binary has no S3 support)

MODEL = "identity_fp32"


@pytest.fixture(scope="module")
def s3(tmp_path_factory, harness):
    with cs.moto_server() as endpoint:
        stage = tmp_path_factory.mktemp("stage")
        shutil.copytree(harness.model_source(MODEL), stage / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
        cs.upload_s3(endpoint, "minio-bucket", "path/to/repo/", stage)
        yield endpoint


@pytest.mark.parametrize("form", ["s3://http://{endpoint}/minio-bucket/path/to/repo",
                                  "s3://{endpoint}//minio-bucket//path/to/repo/"])
def test_s3_endpoint_forms_of_tritons_docs(server_factory, tmp_path, monkeypatch, s3, form):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (tmp_path / "empty").mkdir()
    server = server_factory(repo=tmp_path / "empty", wait_ready=[MODEL],
                            extra_args=["--model-repository", form.format(endpoint=s3)],
                            inferd_args=["--cloud-cache-dir", str(tmp_path / "cache")])
    client = server.http_client()
    data = np.arange(5, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [5], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("OUTPUT0"), data)
    client.close()
