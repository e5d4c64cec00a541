"""Repository agents (supervisor/repository/agents.py): the checksum agent's answers, word for word as
triton-inference-server/checksum_repository_agent gives them, and Triton's message for a missing agent."""

from __future__ import annotations

import hashlib
import os

import pytest
from inferd.supervisor.repository import agents
from inferd.supervisor.repository.config import parse_pbtxt


def _config(agents_text: str):
    return parse_pbtxt('name: "m" backend: "python"\nmodel_repository_agents { agents [ %s ] }\n' % agents_text)


def _checksum(params: dict[str, str]):
    entries = ", ".join('{ key: "%s" value: "%s" }' % kv for kv in params.items())
    return _config('{ name: "checksum", parameters [ %s ] }' % entries)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_bytes(b"print('hello')\n")
    (tmp_path / "table.bin").write_bytes(os.urandom(3 << 20))  # more than one read chunk
    return tmp_path


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_matching_digests_pass(model_dir):
    agents.run_load_agents(_checksum({"MD5:1/model.py": md5(model_dir / "1" / "model.py"),
                                      "md5:table.bin": md5(model_dir / "table.bin")}), str(model_dir))


def test_a_mismatch_names_the_file_and_both_digests(model_dir):
    real = md5(model_dir / "1" / "model.py")
    with pytest.raises(agents.AgentError) as info:
        agents.run_load_agents(_checksum({"MD5:1/model.py": "0123"}), str(model_dir))
    assert str(info.value) == f"Mismatched MD5 hash for file 1/model.py, expect: 0123, got: {real}"


def test_digests_are_compared_as_written(model_dir):
    """The agent compares strings: an upper-case digest does not match (as in Triton)."""
    with pytest.raises(agents.AgentError, match="Mismatched MD5 hash for file 1/model.py"):
        agents.run_load_agents(_checksum({"MD5:1/model.py": md5(model_dir / "1" / "model.py").upper()}),
                               str(model_dir))


@pytest.mark.parametrize(("key", "message"), [
    ("model.py", "failed to parse key: model.py"),
    ("SHA1:1/model.py", "Unsupported checksum algorithm: SHA1"),
    ("MD5:2/model.py", "failed to open text file for read 2/model.py: No such file or directory"),
    ("MD5:1", "failed to open text file for read 1: Is a directory"),
    ("MD5:../secret", "failed to open text file for read ../secret: the path must be inside the model directory"),
    ("MD5:/etc/hostname", "failed to open text file for read /etc/hostname: the path must be inside"),
])
def test_bad_parameters_fail_with_the_agents_words(model_dir, key, message):
    with pytest.raises(agents.AgentError) as info:
        agents.run_load_agents(_checksum({key: "x"}), str(model_dir))
    assert str(info.value).startswith(message)


def test_a_link_inside_the_model_directory_is_followed(model_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("weights") / "w.bin"
    elsewhere.write_bytes(b"weights")
    (model_dir / "1" / "w.bin").symlink_to(elsewhere)
    agents.run_load_agents(_checksum({"MD5:1/w.bin": md5(elsewhere)}), str(model_dir))


def test_agents_run_in_order_and_an_unknown_one_is_missing(model_dir, tmp_path):
    real = md5(model_dir / "1" / "model.py")
    config = _config('{ name: "checksum", parameters { key: "MD5:1/model.py" value: "%s" } }, { name: "decrypt" }'
                     % real)
    with pytest.raises(agents.AgentError) as info:
        agents.run_load_agents(config, str(model_dir), "/opt/agents")
    assert str(info.value) == "unable to find 'libtritonrepoagent_decrypt.so' for repo agent 'decrypt', " \
                              "searched: /opt/agents"
    library = tmp_path / "agents" / "decrypt" / "libtritonrepoagent_decrypt.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF")
    with pytest.raises(agents.AgentError, match="is a shared library .*inferd runs only its built-in repository"):
        agents.run_load_agents(config, str(model_dir), str(tmp_path / "agents"))


def test_the_default_directory_is_tritons():
    with pytest.raises(agents.AgentError, match="searched: /opt/tritonserver/repoagents$"):
        agents.run_load_agents(_config('{ name: "relocation" }'), "/nonexistent")


def test_poll_failed_reads_as_tritons_answer():
    exc = agents.PollFailed("m", "Mismatched MD5 hash for file 1/model.py, expect: a, got: b")
    assert exc.message == ("failed to load 'm', failed to poll from model repository: "
                           "Mismatched MD5 hash for file 1/model.py, expect: a, got: b")
    assert exc.code.name == "INTERNAL"
