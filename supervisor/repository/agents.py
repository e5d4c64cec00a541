"""Repository agents: a config's `model_repository_agents`, run on the model's files before it loads.

Triton invokes each agent the config names, in order, when it polls a model for a load (start-up, poll
mode, an explicit load or reload), before the config is normalised; an agent that fails makes it a poll
failure: the load fails and a model already loaded keeps serving its old version. Triton's agents are
shared libraries in --repoagent-directory; inferd has the agent Triton publishes, `checksum`
(triton-inference-server/checksum_repository_agent), built in, and fails the load for any other name
with Triton's message for an agent whose library is missing.

checksum: each parameter `<algorithm>:<path relative to the model directory>` -> expected digest. Only
MD5 exists; the digest is compared as written (lower-case hex), and the messages are the agent's.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

DEFAULT_DIRECTORY = "/opt/tritonserver/repoagents"  # tritonserver's --repoagent-directory default
BUILT_IN = ("checksum",)
_CHUNK = 1 << 20


class PollFailed(InferdError):
    """A model failed before its load began (Triton: "Poll failed for model directory"). As in Triton the
    client gets INTERNAL; `detail` says why (Triton logs it; inferd also tells the client)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository: {detail}")
        self.detail = detail


class AgentError(Exception):
    """An agent refused the model: the message is the agent's (or Triton's, for a missing agent)."""


def run_load_agents(config: Any, model_dir: str, agent_directory: str = DEFAULT_DIRECTORY) -> None:
    """Run the config's agents (an `inference.ModelConfig`) on `model_dir`; AgentError on the first
    failure. Reads whole model files: call it off the event loop."""
    for agent in config.model_repository_agents.agents:
        if agent.name == "checksum":
            _checksum(dict(agent.parameters), model_dir)
        else:
            raise AgentError(_missing(agent.name, agent_directory))


def _missing(name: str, directory: str) -> str:
    library = f"libtritonrepoagent_{name}.so"
    path = os.path.join(directory, name, library)
    if os.path.isfile(path):  # a Triton agent is there, but inferd cannot load shared libraries
        return (f"repo agent '{name}' is a shared library ({path}): inferd runs only its built-in repository "
                f"agents ({', '.join(BUILT_IN)})")
    return f"unable to find '{library}' for repo agent '{name}', searched: {directory}"


def _checksum(parameters: dict[str, str], model_dir: str) -> None:
    for key in sorted(parameters):  # Triton's order is its map's; sorted keeps inferd's answer stable
        algorithm, sep, relative = key.partition(":")
        if not sep:
            raise AgentError(f"failed to parse key: {key}")
        if algorithm.lower() != "md5":
            raise AgentError(f"Unsupported checksum algorithm: {algorithm}")
        got = _md5(model_dir, relative)
        if got != parameters[key]:
            raise AgentError(f"Mismatched MD5 hash for file {relative}, expect: {parameters[key]}, got: {got}")


def _md5(model_dir: str, relative: str) -> str:
    # Triton reads any path; inferd keeps to the model directory (symbolic links inside it are followed), so
    # that a config given through the load API cannot learn the digest of a file elsewhere
    normal = os.path.normpath(relative)
    if os.path.isabs(relative) or normal == ".." or normal.startswith(".." + os.sep):
        raise AgentError(f"failed to open text file for read {relative}: the path must be inside the model "
                         "directory")
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with open(os.path.join(model_dir, relative), "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise AgentError(f"failed to open text file for read {relative}: {exc.strerror or exc}") from None
    return digest.hexdigest()
