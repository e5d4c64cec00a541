"""Poll mode (triton.md §4.4): the repository is scanned every --repository-poll-secs; a new model
loads, a new version replaces the old one (version policy latest 1), a broken config keeps the old
model serving, a removed model unloads, and explicit load/unload are refused."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

POLL_ARGS = ["--repository-poll-secs", "1"]
CHANGE_S = 60.0  # a change must be served within this (polls every second; loads start workers)


def identity(client, model: str, version: str = "") -> np.ndarray:
    data = np.arange(5, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    out = client.infer(model, [inp], model_version=version).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, data)
    return out


def test_poll_mode_follows_the_repository(server_factory, harness):
    server = server_factory(["identity_fp32"], control_mode="poll", extra_args=POLL_ARGS)
    repo = server.repo
    client = server.http_client()
    try:
        with pytest.raises(InferenceServerException, match="polling is enabled"):
            client.load_model("identity_fp32")

        # a model added to the repository is loaded
        shutil.copytree(harness.model_source("add_sub"), repo / "add_sub",
                        ignore=shutil.ignore_patterns("__pycache__"))
        server.wait_model_ready("add_sub", timeout=CHANGE_S)

        # a new version replaces the old one
        shutil.copytree(repo / "identity_fp32" / "1", repo / "identity_fp32" / "2",
                        ignore=shutil.ignore_patterns("__pycache__"))
        server.wait_until(lambda: server.model_ready("identity_fp32", "2")
                          and not server.model_ready("identity_fp32", "1"), CHANGE_S, "version 2 replacing 1")
        identity(client, "identity_fp32", "2")

        # a config that no longer parses: the loaded model keeps serving; a model added in the same
        # change shows that the scan which saw it is over
        (repo / "identity_fp32" / "config.pbtxt").write_text("this is { not a config")
        shutil.copytree(harness.model_source("string_reverse"), repo / "string_reverse",
                        ignore=shutil.ignore_patterns("__pycache__"))
        server.wait_model_ready("string_reverse", timeout=CHANGE_S)
        assert server.model_ready("identity_fp32")
        identity(client, "identity_fp32")

        # a removed model is unloaded
        shutil.rmtree(repo / "add_sub")
        server.wait_until(lambda: not server.model_ready("add_sub"), CHANGE_S, "add_sub unloaded")
        assert server.model_ready("string_reverse") and server.model_ready("identity_fp32")
        with pytest.raises(InferenceServerException, match="polling is enabled"):
            client.unload_model("string_reverse")
    finally:
        client.close()
