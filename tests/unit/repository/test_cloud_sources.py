"""Cloud repositories without a network: URLs (Triton's forms), credential choice (Triton's rules),
the snapshot cache and the local + cloud source list, against a store held in a dict (the real stores
are tested against real servers in tests/e2e/test_cloud_repository.py)."""

from __future__ import annotations

import json
import os

import pytest
from inferd.supervisor.repository.cloud import snapshot_cache as cloud_cache
from inferd.supervisor.repository.cloud.credentials import AzureCredential, CloudCredentials, S3Credential
from inferd.supervisor.repository.cloud.location import parse_url
from inferd.supervisor.repository.cloud.store import ObjectInfo
from inferd.worker.wire.errors import ErrorCode, InferdError


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket/path/to/repo", ("s3", "", "bucket", "path/to/repo/", "", "s3://bucket")),
    ("s3://bucket", ("s3", "", "bucket", "", "", "s3://bucket")),
    ("s3://127.0.0.1:9000/bucket/models/", ("s3", "http://127.0.0.1:9000", "bucket", "models/", "",
                                             "s3://127.0.0.1:9000/bucket")),
    ("s3://https://minio.local:443/b/m", ("s3", "https://minio.local:443", "b", "m/", "",
                                           "s3://https://minio.local:443/b")),
    ("gs://bucket/a//b", ("gs", "", "bucket", "a/b/", "", "gs://bucket")),
    ("as://acct/container/models", ("as", "", "container", "models/", "acct", "as://acct/container")),
])
def test_urls_parse_as_triton_reads_them(url, expected):
    loc = parse_url(url)
    assert (loc.scheme, loc.endpoint, loc.bucket, loc.prefix, loc.account, loc.bucket_url) == expected


def test_credential_file_longest_prefix_wins_and_env_is_the_fallback(tmp_path):
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({
        "s3": {"": {"key_id": "any", "secret_key": "s0"},
               "s3://special": {"key_id": "special", "secret_key": "s1", "region": "eu-west-1"}},
        "gs": {"gs://b2": "/keys/b2.json"},
        "as": {"as://acct/c": {"account_str": "acct", "account_key": "filekey"}},
    }))
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path), "GOOGLE_APPLICATION_CREDENTIALS": "/keys/env.json",
           "AZURE_STORAGE_KEY": "envkey", "UNRELATED": "x"}
    creds = CloudCredentials.from_environ(env)
    assert "UNRELATED" not in dict(creds.env)
    special = creds.for_location(parse_url("s3://special/models"))
    assert isinstance(special, S3Credential) and (special.key_id, special.region) == ("special", "eu-west-1")
    assert creds.for_location(parse_url("s3://other/models")).key_id == "any"  # type: ignore[union-attr]
    assert creds.for_location(parse_url("gs://b2/m")).credentials_file == "/keys/b2.json"  # type: ignore[union-attr]
    assert creds.for_location(parse_url("gs://b1/m")).credentials_file == "/keys/env.json"  # type: ignore[union-attr]
    assert creds.for_location(parse_url("as://acct/c/m")) == AzureCredential("acct", "filekey")
    assert creds.for_location(parse_url("as://acct/other/m")).key == "envkey"  # type: ignore[union-attr]


def test_secrets_stay_out_of_reprs():
    creds = CloudCredentials.from_environ({"AWS_SECRET_ACCESS_KEY": "topsecret", "AZURE_STORAGE_KEY": "azsecret"})
    text = repr(creds) + repr(creds.for_location(parse_url("s3://b/m"))) + repr(creds.for_location(parse_url("as://a/c")))
    assert "AWS_SECRET_ACCESS_KEY" in text and "topsecret" not in text and "azsecret" not in text


def test_aws_environment_and_azure_connection_string():
    creds = CloudCredentials.from_environ({
        "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-west-2",
        "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=ck;"
                                           "BlobEndpoint=http://127.0.0.1:10000/dev/;"})
    s3 = creds.for_location(parse_url("s3://b/m"))
    assert (s3.key_id, s3.secret_key, s3.region) == ("k", "s", "us-west-2")  # type: ignore[union-attr]
    assert creds.for_location(parse_url("as://dev/c")) == AzureCredential("dev", "ck", "http://127.0.0.1:10000/dev")


class DictStore:
    """Objects in a dict; `fail_on` makes one key's download raise, `short` writes half of one."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.downloads: list[str] = []
        self.fail_on = ""
        self.short = ""

    def list(self, prefix):
        for key, data in sorted(self.objects.items()):
            if key.startswith(prefix):
                yield ObjectInfo(key, len(data), str(hash(data)))

    def download(self, key, dest):
        self.downloads.append(key)
        if key == self.fail_on:
            raise ConnectionResetError("connection reset by peer")
        data = self.objects[key]
        with open(dest, "xb") as f:
            f.write(data[: len(data) // 2] if key == self.short else data)


def make_repo(tmp_path, objects):
    repo = cloud_cache.CloudRepository(parse_url("s3://bucket/repo"), CloudCredentials(), str(tmp_path / "cache"),
                                       5.0)
    store = DictStore(objects)
    repo._store = store
    return repo, store


def snapshots(tmp_path, name):
    base = next((tmp_path / "cache").iterdir()) / name
    return sorted(p.name for p in base.iterdir())


def test_a_model_is_copied_once_per_content_change_and_unchanged_files_are_linked(tmp_path):
    repo, store = make_repo(tmp_path, {"repo/m/config.pbtxt": b"cfg", "repo/m/1/model.py": b"v1",
                                       "repo/other/1/x": b"x", "repo/README": b"not a model"})
    assert set(repo.refresh()) == {"m", "other"}
    root = repo.materialize("m", repo.model_objects("m"))
    with open(os.path.join(root, "m", "1", "model.py"), "rb") as f:
        assert f.read() == b"v1"
    assert repo.materialize("m", repo.model_objects("m")) == root  # unchanged: nothing downloaded again
    assert sorted(store.downloads) == ["repo/m/1/model.py", "repo/m/config.pbtxt"]
    store.objects["repo/m/2/model.py"] = b"v2"
    store.downloads.clear()
    root2 = repo.materialize("m", repo.model_objects("m"))
    assert root2 != root and store.downloads == ["repo/m/2/model.py"]
    assert os.path.samefile(os.path.join(root, "m", "config.pbtxt"), os.path.join(root2, "m", "config.pbtxt"))


@pytest.mark.parametrize("fault", ["fail_on", "short"])
def test_a_broken_download_leaves_no_snapshot(tmp_path, fault):
    repo, store = make_repo(tmp_path, {"repo/m/config.pbtxt": b"cfg", "repo/m/1/model.bin": b"0123456789"})
    setattr(store, fault, "repo/m/1/model.bin")
    with pytest.raises(InferdError) as err:
        repo.materialize("m", repo.model_objects("m"))
    assert err.value.code == ErrorCode.INVALID_ARG and "repo/m/1/model.bin" in err.value.message
    assert ("connection reset" if fault == "fail_on" else "5 bytes received, the object has 10") in err.value.message
    assert snapshots(tmp_path, "m") == []  # nothing half-copied, no temp dir left


def test_keys_that_would_leave_the_model_directory_are_skipped(tmp_path):
    repo, _ = make_repo(tmp_path, {"repo/m/1/../../../escape": b"x", "repo/m/1/ok": b"y"})
    root = repo.materialize("m", repo.model_objects("m"))
    assert os.listdir(os.path.join(root, "m", "1")) == ["ok"]
    assert not (tmp_path / "escape").exists()


def test_an_unlistable_repository_keeps_its_models_and_does_not_stop_the_others(tmp_path):
    from inferd.supervisor.repository.sources import CloudSettings, Repositories

    repos = Repositories(["s3://one/r", "s3://two/r"], CloudSettings(CloudCredentials(), str(tmp_path / "c"), 5.0))
    try:
        one, two = DictStore({"r/a/1/x": b"a"}), DictStore({"r/b/1/x": b"b"})
        repos.cloud["s3://one/r"]._store, repos.cloud["s3://two/r"]._store = one, two
        first = repos.fingerprints()
        assert set(first) == {"a", "b"}

        def broken(prefix):
            raise ConnectionRefusedError("connection refused")

        one.list = broken  # type: ignore[method-assign]
        two.objects["r/b/2/x"] = b"b2"
        second = repos.fingerprints()
        assert second["a"] == first["a"] and second["b"] != first["b"]
        with pytest.raises(InferdError, match="connection refused"):
            repos.find_model("a")  # found nowhere else: the listing's failure is the reason
        assert repos.find_model("b").versions == (1, 2)  # found in the other repository: loads
    finally:
        repos.close()


def test_storage_sdks_are_imported_only_when_a_cloud_repository_is_named(tmp_path):
    import subprocess
    import sys

    code = ("import sys\n"
            "from inferd.supervisor import app, config\n"
            "from inferd.supervisor.repository.sources import Repositories\n"
            f"Repositories([{str(tmp_path)!r}]).list_models()\n"
            "print(sorted(m for m in ('boto3', 'botocore', 'google.cloud.storage', 'azure.storage.blob') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_copy_stops_at_shutdown_and_leaves_nothing(tmp_path):
    repo, store = make_repo(tmp_path, {"repo/m/config.pbtxt": b"cfg", "repo/m/1/a": b"a", "repo/m/1/b": b"b"})
    objects = repo.model_objects("m")
    real = store.download

    def download_then_close(key, dest):
        real(key, dest)
        repo.closing.set()  # the server shuts down while the first object arrives

    store.download = download_then_close  # type: ignore[method-assign]
    with pytest.raises(InferdError, match="shutting down"):
        repo.materialize("m", objects)
    assert len(store.downloads) == 1 and snapshots(tmp_path, "m") == []


def test_a_name_in_a_local_and_a_cloud_repository_is_a_duplicate(tmp_path):
    from inferd.supervisor.repository.sources import CloudSettings, Repositories

    local = tmp_path / "local"
    (local / "m" / "1").mkdir(parents=True)
    (local / "solo" / "1").mkdir(parents=True)
    repos = Repositories([str(local), "s3://b/r"], CloudSettings(CloudCredentials(), str(tmp_path / "c"), 5.0))
    try:
        repos.cloud["s3://b/r"]._store = DictStore({"r/m/1/x": b"x", "r/cloudy/1/x": b"y"})
        repos.refresh()
        scan = repos.list_models()
        assert scan.models == {"solo": str(local), "cloudy": "s3://b/r"}
        assert scan.duplicates == {"m": (str(local), "s3://b/r")}
        with pytest.raises(InferdError, match="more than one model repository"):
            repos.find_model("m")
        assert repos.find_model("cloudy").path.startswith(str(tmp_path / "c"))
        assert repos.find_model("solo").path == str(local / "solo")
    finally:
        repos.close()
