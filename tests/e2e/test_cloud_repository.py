"""Cloud model repositories (s3://, gs://, as://) against real local servers started here: moto's S3
server, gcp-storage-emulator, Azurite. A model is copied once per content change into a local cache
and served from there; a broken download (connection cut, short object), a missing bucket or bad
credentials leave the model UNAVAILABLE with the reason, nothing half-copied, the server alive."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent))
import cloud_stores as cs  # noqa: E402

pytest.importorskip("boto3")
pytest.importorskip("moto")
pytestmark = pytest.mark.inferd_only  # --cloud-cache-dir, and the copies it inspects, are inferd's

MODEL = "identity_fp32"
BIG = "1/weights.bin"  # a 512 KiB file in the model, the one the proxy damages
CHANGE_S = 60.0
CLOUD_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION",
             "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "GOOGLE_APPLICATION_CREDENTIALS",
             "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
             "TRITON_CLOUD_CREDENTIAL_PATH")


@pytest.fixture(autouse=True)
def clean_cloud_env(monkeypatch):
    for name in CLOUD_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probing in tests


@pytest.fixture(scope="module")
def s3():
    with cs.moto_server() as endpoint:
        proxy = cs.BreakingProxy(int(endpoint.rsplit(":", 1)[1]))
        try:
            yield endpoint, proxy
        finally:
            proxy.close()


def staged_model(tmp_path: Path, harness) -> Path:
    """A directory holding MODEL (from examples) plus BIG, ready to upload."""
    stage = tmp_path / "stage"
    shutil.copytree(harness.model_source(MODEL), stage / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    (stage / MODEL / BIG).write_bytes(np.random.default_rng(0).bytes(512 * 1024))
    return stage


def infer_identity(server, model: str = MODEL) -> None:
    client = server.http_client()
    try:
        data = np.arange(7, dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer(model, [inp]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def index(server) -> dict[str, dict]:
    code, body = server.post("/v2/repository/index", b"{}")
    assert code == 200, body
    return {row["name"]: row for row in json.loads(body)}


def snapshot_dirs(cache: Path) -> list[str]:
    """Every entry under the cache's model directories (snapshots and leftovers alike)."""
    return sorted(str(p.relative_to(cache)) for p in cache.glob("*/*/*"))


def test_s3_repository_beside_a_local_one_is_copied_once(server_factory, harness, tmp_path, monkeypatch, s3):
    endpoint, proxy = s3
    cs.upload_s3(endpoint, "mixed", "repo/", staged_model(tmp_path, harness))
    url = f"s3://127.0.0.1:{proxy.port}/mixed/repo"
    creds = tmp_path / "creds.json"  # TRITON_CLOUD_CREDENTIAL_PATH, the entry for this bucket
    creds.write_text(json.dumps({"s3": {"": {"key_id": "wrong", "secret_key": "wrong"},
                                        f"s3://127.0.0.1:{proxy.port}/mixed": {"key_id": "testing",
                                                                               "secret_key": "testing"}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
    cache = tmp_path / "cache"
    proxy.mode, proxy.marker, proxy.hits = "pass", b"weights.bin", 0
    args = dict(extra_args=["--model-repository", url], inferd_args=["--cloud-cache-dir", str(cache)],
                wait_ready=["add_sub", MODEL])
    server = server_factory(["add_sub"], **args)  # a local repository with add_sub, and the bucket
    infer_identity(server)
    assert set(index(server)) == {"add_sub", MODEL}
    assert proxy.hits == 1 and len(snapshot_dirs(cache)) == 1
    server.stop()
    server = server_factory(repo=server.repo, **args)  # a restart finds the copy: nothing downloaded
    infer_identity(server)
    assert proxy.hits == 1 and len(snapshot_dirs(cache)) == 1


def test_s3_poll_mode_follows_the_bucket(server_factory, harness, tmp_path, monkeypatch, s3):
    endpoint, proxy = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    put = cs.upload_s3(endpoint, "polled", "", staged_model(tmp_path, harness))
    proxy.mode, proxy.marker, proxy.hits = "pass", b"weights.bin", 0
    cache = tmp_path / "cache"
    server = server_factory(control_mode="poll", wait_ready=[MODEL],
                            extra_args=["--model-repository", f"s3://127.0.0.1:{proxy.port}/polled",
                                        "--repository-poll-secs", "1"],
                            inferd_args=["--cloud-cache-dir", str(cache)])
    # a new version in the bucket replaces the old one; the unchanged weights are not downloaded again
    put(f"{MODEL}/2/model.py", (harness.model_source(MODEL) / "1" / "model.py").read_bytes())
    server.wait_until(lambda: server.model_ready(MODEL, "2") and not server.model_ready(MODEL, "1"),
                      CHANGE_S, "version 2 replacing 1")
    infer_identity(server)
    assert proxy.hits == 1
    # the model's objects removed: unloaded
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{endpoint}", region_name="us-east-1")
    for obj in client.list_objects_v2(Bucket="polled")["Contents"]:
        client.delete_object(Bucket="polled", Key=obj["Key"])
    server.wait_until(lambda: not server.model_ready(MODEL), CHANGE_S, "the model unloaded")
    assert server.is_live()


@pytest.mark.parametrize("fault", ["cut", "short", "stall"])
def test_s3_broken_download_leaves_the_model_unavailable(server_factory, harness, tmp_path, monkeypatch, s3, fault):
    """The connection cut mid-object, an object shorter than listed, or a server that stops sending
    (--cloud-timeout-secs): the load API fails with the reason, nothing is left in the cache, the
    server lives; once the network heals the load works."""
    endpoint, proxy = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = f"broken-{fault}"
    cs.upload_s3(endpoint, bucket, "r/", staged_model(tmp_path, harness))
    cache = tmp_path / "cache"
    proxy.mode, proxy.marker, proxy.damaged = fault, b"weights.bin", 0
    server = server_factory(control_mode="explicit", wait_ready=[],
                            extra_args=["--model-repository", f"s3://127.0.0.1:{proxy.port}/{bucket}/r"],
                            inferd_args=["--cloud-cache-dir", str(cache), "--cloud-timeout-secs", "3"])
    client = server.http_client()
    try:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(MODEL)
        assert "weights.bin" in str(err.value) and proxy.damaged >= 1
        if fault == "stall":
            assert "timeout" in str(err.value).lower(), err.value
        row = index(server)[MODEL]
        assert row["state"] == "UNAVAILABLE" and "weights.bin" in row["reason"]
        assert snapshot_dirs(cache) == []  # no snapshot, no temp dir left
        assert server.is_live() and not server.model_ready(MODEL)
        proxy.mode = "pass"
        client.load_model(MODEL)
        infer_identity(server)
        assert len(snapshot_dirs(cache)) == 1
    finally:
        proxy.mode = "pass"
        client.close()


def test_s3_missing_bucket_leaves_the_model_unavailable(server_factory, tmp_path, monkeypatch, s3):
    endpoint, _ = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    server = server_factory(["add_sub"], control_mode="explicit", load_models=["add_sub", MODEL],
                            wait_ready=["add_sub"],
                            extra_args=["--model-repository", f"s3://{endpoint}/no-such-bucket/models"],
                            inferd_args=["--cloud-cache-dir", str(tmp_path / "cache")])
    row = server.wait_until(lambda: index(server).get(MODEL, {}).get("state") == "UNAVAILABLE" and index(server)[MODEL],
                            CHANGE_S, "the load from a missing bucket to fail")
    assert "NoSuchBucket" in row["reason"], row
    assert server.is_live()


def add_env_model(stage: Path, harness) -> str:
    """A copy of MODEL whose EXECUTION_ENV_PATH names a tarball inside the model directory (bin/python:
    a wrapper around this interpreter, which has numpy and pyzmq)."""
    name = "identity_env"
    shutil.copytree(harness.model_source(MODEL), stage / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = stage / name / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{MODEL}"', f'name: "{name}"') + '\nparameters: { key: '
                      '"EXECUTION_ENV_PATH", value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    with tarfile.open(stage / name / "env.tar.gz", "w:gz") as tar:
        for member, data, mode in (("bin/python", f'#!/bin/sh\nexec {sys.executable} "$@"\n'.encode(), 0o755),
                                   ("conda-meta/history", b"", 0o644)):
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return name


def test_gcs_repository_with_an_execution_environment(server_factory, harness, tmp_path, monkeypatch):
    pytest.importorskip("google.cloud.storage")
    pytest.importorskip("gcp_storage_emulator")
    stage = staged_model(tmp_path, harness)
    env_model = add_env_model(stage, harness)
    with cs.gcs_server() as endpoint:
        cs.upload_gcs(endpoint, "gcs-models", "path/to/repo/", stage)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        cache, envs = tmp_path / "cache", tmp_path / "envs"
        server = server_factory(wait_ready=[MODEL, env_model],
                                extra_args=["--model-repository", "gs://gcs-models/path/to/repo"],
                                inferd_args=["--cloud-cache-dir", str(cache), "--env-cache-dir", str(envs)])
        infer_identity(server)
        infer_identity(server, env_model)
        assert len(snapshot_dirs(cache)) == 2
        copied = next(cache.glob(f"*/{MODEL}/*/{MODEL}/{BIG}"))
        assert copied.read_bytes() == (stage / MODEL / BIG).read_bytes()
        # the tarball came down with the model and was unpacked into the environment cache
        assert list(envs.glob("*.ready.json")), sorted(p.name for p in envs.iterdir())


@pytest.fixture
def azurite(tmp_path):
    pytest.importorskip("azure.storage.blob")
    missing = cs.azurite_missing()
    if missing:
        pytest.skip(missing)
    workdir = tmp_path / "azurite"
    workdir.mkdir()
    with cs.azurite_server(workdir) as endpoint:
        yield endpoint


def test_azure_repository_and_bad_credentials(server_factory, harness, tmp_path, monkeypatch, azurite):
    cs.upload_azure(azurite, "container", "models/", staged_model(tmp_path, harness))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", cs.AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", cs.AZURITE_KEY)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={azurite}")  # where Azurite listens
    url = f"as://{cs.AZURITE_ACCOUNT}/container/models"
    cache = tmp_path / "cache"
    server = server_factory(wait_ready=[MODEL], extra_args=["--model-repository", url],
                            inferd_args=["--cloud-cache-dir", str(cache)])
    infer_identity(server)
    server.stop()
    # a wrong key: Azurite refuses the signature; the server lives and says why
    monkeypatch.setenv("AZURE_STORAGE_KEY", "d3Jvbmcga2V5" * 4)
    server = server_factory(control_mode="explicit", wait_ready=[], extra_args=["--model-repository", url],
                            inferd_args=["--cloud-cache-dir", str(tmp_path / "cache2")])
    client = server.http_client()
    try:
        with pytest.raises(InferenceServerException, match="AuthorizationFailure|AuthenticationFailed"):
            client.load_model(MODEL)
        assert server.is_live() and not server.model_ready(MODEL)
        row = index(server)[MODEL]
        assert row["state"] == "UNAVAILABLE" and "failed to authenticate" in row["reason"]
        assert not os.path.exists(tmp_path / "cache2") or snapshot_dirs(tmp_path / "cache2") == []
    finally:
        client.close()


def test_s3_bad_credentials_leave_the_model_unavailable(server_factory, harness, tmp_path, monkeypatch, s3):
    """moto checks signatures against its IAM users once authentication is on: an unknown key is refused."""
    from moto.core.authorization import enable_iam_authentication

    endpoint, _ = s3
    cs.upload_s3(endpoint, "guarded", "", staged_model(tmp_path, harness))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-known-secret")
    with enable_iam_authentication():
        server = server_factory(control_mode="explicit", wait_ready=[],
                                extra_args=["--model-repository", f"s3://{endpoint}/guarded"],
                                inferd_args=["--cloud-cache-dir", str(tmp_path / "cache")])
        client = server.http_client()
        try:
            with pytest.raises(InferenceServerException, match="InvalidAccessKeyId"):
                client.load_model(MODEL)
            assert server.is_live() and not server.model_ready(MODEL)
            assert "InvalidAccessKeyId" in index(server)[MODEL]["reason"]
        finally:
            client.close()
            server.stop()


def test_gcs_unreadable_credential_file_is_the_reason(tmp_path):
    """GOOGLE_APPLICATION_CREDENTIALS naming a file that is no credential: the listing fails with why."""
    pytest.importorskip("google.cloud.storage")
    from inferd.supervisor.repository.cloud.credentials import CloudCredentials
    from inferd.supervisor.repository.cloud.location import parse_url
    from inferd.supervisor.repository.cloud.snapshot_cache import CloudRepository
    from inferd.worker.wire.errors import InferdError

    bad = tmp_path / "key.json"
    bad.write_text('{"type": "service_account"}')
    creds = CloudCredentials.from_environ({"GOOGLE_APPLICATION_CREDENTIALS": str(bad)})
    repo = CloudRepository(parse_url("gs://bucket/models"), creds, str(tmp_path / "cache"), 5.0)
    with pytest.raises(InferdError, match="failed to open model repository 'gs://bucket/models'"):
        repo.refresh()
