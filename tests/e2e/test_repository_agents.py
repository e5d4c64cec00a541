"""Repository agents (issue 43 item 3), as Triton 2.51 runs them: a config's `model_repository_agents` run
before each load (start-up, explicit load and reload); the checksum agent fails a load whose file does
not have the MD5 the config gives, naming the file; an agent that does not exist fails the load with
Triton's message naming --repoagent-directory. Such a failure is a poll failure, as Triton has it: the
client gets 500 / INTERNAL "failed to load '<m>', failed to poll from model repository", the log says
"Poll failed for model directory '<m>': <why>", the model gets no state in the index, strict readiness
does not count it, and a model already loaded keeps serving.

Against the real Triton (INFERD_E2E_TARGET=triton) the checksum cases need the agent built for it
(`bash tests/tools/checksum_agent.sh build`: the pytriton wheel ships no repository agents); the
missing-agent case runs there as it is."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

AGENT_LIBRARY = Path("checksum") / "libtritonrepoagent_checksum.so"
POLL_FAILED = "failed to poll from model repository"


def agent_directory(tmp_path: Path, triton: bool) -> Path:
    """--repoagent-directory: for Triton, the one holding the checksum agent we built; for inferd an empty
    one (its checksum agent is built in)."""
    if not triton:
        return tmp_path
    built = Path(os.environ.get("TRITON_REF_DIR", Path.home() / ".cache" / "triton-reference")) / "repoagents"
    if not (built / AGENT_LIBRARY).is_file():
        pytest.skip(f"no checksum agent for the reference Triton in {built}: bash tests/tools/checksum_agent.sh build")
    return built


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def add_model(repo: Path, name: str, agents: str) -> Path:
    """identity_fp32 as `name`, with `agents` (the body of model_repository_agents { agents [...] }, if any)."""
    src = Path(__file__).resolve().parents[2] / "examples" / "identity_fp32"
    shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace('name: "identity_fp32"', f'name: "{name}"')
    if agents:  # an empty `agents [ ]` would crash Triton 2.51 (SIGSEGV in its poll; inferd loads the model)
        text += f"\nmodel_repository_agents {{ agents [ {agents} ] }}\n"
    config.write_text(text)
    return repo / name


def checksum(path: str, digest: str) -> str:
    return f'{{ name: "checksum", parameters {{ key: "MD5:{path}" value: "{digest}" }} }}'


def index_row(server, name: str) -> dict:
    client = server.http_client()
    try:
        return next(row for row in client.get_model_repository_index() if row["name"] == name)
    finally:
        client.close()


def infer_ok(server, name: str) -> None:
    client = server.http_client()
    try:
        data = np.arange(4, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(data)
        assert np.array_equal(client.infer(name, [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def _triton() -> bool:
    return os.environ.get("INFERD_E2E_TARGET", "inferd").strip().lower() == "triton"


@pytest.fixture
def repo(tmp_path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def agents_dir(tmp_path) -> Path:
    (tmp_path / "agents").mkdir()
    return agent_directory(tmp_path / "agents", _triton())


def test_matching_checksum_loads_and_the_config_shows_the_agents(server_factory, repo, agents_dir):
    digest = md5(add_model(repo, "good", "") / "1" / "model.py")
    shutil.rmtree(repo / "good")
    add_model(repo, "good", checksum("1/model.py", digest))
    server = server_factory(repo=repo, models=["good"], extra_args=["--repoagent-directory", str(agents_dir)])
    infer_ok(server, "good")
    client = server.http_client()
    try:
        config = client.get_model_config("good")
    finally:
        client.close()
    assert config["model_repository_agents"] == {
        "agents": [{"name": "checksum", "parameters": {"MD5:1/model.py": digest}}]}


def test_a_mismatched_checksum_fails_the_load_naming_the_file(server_factory, repo, agents_dir):
    good = add_model(repo, "good", "")
    bad = add_model(repo, "bad", checksum("1/model.py", "0123"))
    server = server_factory(repo=repo, models=["good", "bad"], wait_ready=["good"],
                            extra_args=["--repoagent-directory", str(agents_dir)])
    expected = (f"Poll failed for model directory 'bad': Mismatched MD5 hash for file 1/model.py, "
                f"expect: 0123, got: {md5(bad / '1' / 'model.py')}")
    server.wait_until(lambda: expected in server.log(), 30, "the checksum failure in the log")
    assert not server.model_ready("bad") and md5(good / "1" / "model.py") == md5(bad / "1" / "model.py")
    assert index_row(server, "bad") == {"name": "bad"}  # no state: it never got to loading
    assert server.get("/v2/health/ready")[0] == 200  # strict readiness counts loads, not poll failures


def test_an_agent_that_does_not_exist_fails_the_load(server_factory, repo, tmp_path):
    agents = tmp_path / "no_agents"
    agents.mkdir()
    add_model(repo, "good", "")
    add_model(repo, "decrypted", '{ name: "decrypt", parameters { key: "key" value: "k1" } }')
    server = server_factory(repo=repo, models=["good", "decrypted"], wait_ready=["good"],
                            extra_args=["--repoagent-directory", str(agents)])
    expected = (f"Poll failed for model directory 'decrypted': unable to find 'libtritonrepoagent_decrypt.so' "
                f"for repo agent 'decrypt', searched: {agents}")
    server.wait_until(lambda: expected in server.log(), 30, "the missing agent in the log")
    assert not server.model_ready("decrypted")
    assert index_row(server, "decrypted") == {"name": "decrypted"}


def test_a_mismatch_stops_the_start_with_exit_on_error(server_factory, repo, agents_dir, harness):
    add_model(repo, "bad", checksum("1/model.py", "0123"))
    try:  # the server may or may not be live for a moment before it exits
        server_factory(repo=repo, models=["bad"], wait_ready=[],
                       extra_args=["--repoagent-directory", str(agents_dir), "--exit-on-error", "true"])
    except harness.ServerStartError:
        pass
    server = server_factory.servers[-1]
    server.proc.wait(timeout=60)
    log = server.log()
    assert "Poll failed for model directory 'bad': Mismatched MD5 hash for file 1/model.py" in log
    assert "failed to load all models" in log and server.proc.returncode != 0


def test_explicit_load_and_reload_check_again(server_factory, repo, agents_dir):
    model_py = add_model(repo, "good", "") / "1" / "model.py"
    digest = md5(model_py)
    shutil.rmtree(repo / "good")
    add_model(repo, "good", checksum("1/model.py", digest))
    bad = add_model(repo, "bad", checksum("1/model.py", "0123"))
    server = server_factory(repo=repo, models=["good", "bad"], control_mode="explicit", load_models=["good"],
                            extra_args=["--repoagent-directory", str(agents_dir)])
    http, grpc = server.http_client(), grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match=f"failed to load 'bad', {POLL_FAILED}"):
            http.load_model("bad")
        with pytest.raises(InferenceServerException, match=f"failed to load 'bad', {POLL_FAILED}") as info:
            grpc.load_model("bad")
        assert info.value.status() == "StatusCode.INTERNAL"
        assert server.post("/v2/repository/models/bad/load")[0] == 500
        assert index_row(server, "bad") == {"name": "bad"}

        # a config given with the load request runs its agents too (on the model's directory)
        override = http.get_model_config("good")
        override["model_repository_agents"]["agents"][0]["parameters"] = {"MD5:1/model.py": "0123"}
        with pytest.raises(InferenceServerException, match=f"failed to load 'good', {POLL_FAILED}"):
            http.load_model("good", config=json.dumps(override))
        assert index_row(server, "good")["state"] == "READY"

        # the loaded model's file changes: a reload fails and the loaded version keeps serving
        model_py.write_text(model_py.read_text() + "# changed\n")
        with pytest.raises(InferenceServerException, match=f"failed to load 'good', {POLL_FAILED}"):
            http.load_model("good")
        assert f"Mismatched MD5 hash for file 1/model.py, expect: {digest}" in server.log()
        assert index_row(server, "good")["state"] == "READY"
        infer_ok(server, "good")
        assert server.get("/v2/health/ready")[0] == 200

        # the config names the new digest: the reload goes through
        config = repo / "good" / "config.pbtxt"
        config.write_text(config.read_text().replace(digest, md5(model_py)))
        http.load_model("good")
        infer_ok(server, "good")

        # the bad model's config corrected: it loads
        config = bad.parent / "bad" / "config.pbtxt"
        config.write_text(config.read_text().replace('value: "0123"', f'value: "{md5(bad / "1" / "model.py")}"'))
        http.load_model("bad")
        infer_ok(server, "bad")
    finally:
        http.close()
        grpc.close()
