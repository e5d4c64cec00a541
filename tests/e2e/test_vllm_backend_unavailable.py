"""A `backend: "vllm"` model on a host whose environment lacks vLLM (the project's own test environment): the
repository is accepted as Triton's vllm_backend layout (no "backend not found"), and the model is UNAVAILABLE
with the reason and the install hint, the server and its other models serving on (issue 39 item 2). The
engine itself is tested in test_vllm_engine.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0,
    reason="vLLM is installed in this environment: the engine tests (test_vllm_engine.py) cover it")


def _vllm_model(repo: Path, name: str) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    # as vllm_backend's samples: the config names the backend only; inputs and outputs are auto-completed
    (folder / "config.pbtxt").write_text('backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n')
    (folder / "1" / "model.json").write_text(json.dumps({"model": "tiny", "gpu_memory_utilization": 0.1}))


def test_vllm_model_without_vllm_is_unavailable_with_the_install_hint(server_factory) -> None:
    repo = server_factory.make_repo(["identity"])
    _vllm_model(repo, "llm")
    server = server_factory(repo=repo, wait_ready=["identity"])

    def settled() -> dict | None:  # the load of "llm" ends after identity's (auto-complete, then the load)
        status, body = server.post("/v2/repository/index", b"{}")
        assert status == 200
        entry = next(e for e in json.loads(body) if e["name"] == "llm")
        return entry if entry.get("state") not in (None, "LOADING") else None

    entry = server.wait_until(settled, 60, "the load of 'llm' to end")
    assert entry["state"] == "UNAVAILABLE", entry
    assert "pip install 'inferd[vllm]'" in entry["reason"] and "'vllm' package" in entry["reason"], entry
    assert not server.model_ready("llm") and server.model_ready("identity")
