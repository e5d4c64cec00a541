"""Model namespacing (`--model-namespacing=true`), Triton's qa L0_model_namespacing (v2.51.0) rewritten with
its models in this file, in poll and explicit mode (issue 43 item 10): the same model name in two
repositories is two models; an ensemble's step resolves in the ensemble's own repository (else the one model
of that name elsewhere, followed as models come and go); a client's request by a name of several models gets
Triton's "... model namespace must be provided to resolve ambiguity.". inferd refused the flag. Passes
against Triton 2.51 (INFERD_E2E_TARGET=triton).

Repositories (qa's): addsub_repo and subadd_repo, each with a Python model (OUTPUT0 = INPUT0 + INPUT1 and
OUTPUT1 = INPUT0 - INPUT1 in addsub_repo, the other way round in subadd_repo) and an ensemble over it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

IO = '''max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
'''
MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils

SIGN = {sign}  # 1: OUTPUT0 = a + b, OUTPUT1 = a - b; -1: the other way round


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (a + SIGN * b).astype(np.int32)),
                                                   pb_utils.Tensor("OUTPUT1", (a - SIGN * b).astype(np.int32))]))
        return out
'''
STEP = ('ensemble_scheduling { step [ { model_name: "%s" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" } '
        'output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }\n')
AMBIGUOUS = "model namespace must be provided to resolve ambiguity"
# qa's four repository layouts: {repository: {model: (kind, what)}}; kind "python" (sign) or "ensemble" (step)
PAIR = {"addsub_repo": 1, "subadd_repo": -1}


def _layout(composing: dict[str, str], ensembles: dict[str, tuple[str, str]]) -> dict:
    """{repository: {model: (kind, what)}}: kind "python" (its sign) or "ensemble" (its step's model)."""
    return {repo: {composing[repo]: ("python", sign), ensembles[repo][0]: ("ensemble", ensembles[repo][1])}
            for repo, sign in PAIR.items()}


# qa's repository layouts
LAYOUTS = {
    "no_duplication": _layout({"addsub_repo": "composing_addsub", "subadd_repo": "composing_subadd"},
                              {"addsub_repo": ("simple_addsub", "composing_addsub"),
                               "subadd_repo": ("simple_subadd", "composing_subadd")}),
    "duplication": _layout({"addsub_repo": "composing_model", "subadd_repo": "composing_model"},
                           {"addsub_repo": ("simple_addsub", "composing_model"),
                            "subadd_repo": ("simple_subadd", "composing_model")}),
    "ensemble_duplication": _layout({"addsub_repo": "composing_addsub", "subadd_repo": "composing_subadd"},
                                    {"addsub_repo": ("simple_ensemble", "composing_addsub"),
                                     "subadd_repo": ("simple_ensemble", "composing_subadd")}),
}


def build(root: Path, layout: str) -> tuple[Path, Path]:
    for repo, models in LAYOUTS[layout].items():
        for name, (kind, what) in models.items():
            d = root / repo / name
            (d / "1").mkdir(parents=True)
            if kind == "python":
                (d / "config.pbtxt").write_text(f'backend: "python"\n{IO}')
                (d / "1" / "model.py").write_text(MODEL.format(sign=what))
            else:
                (d / "config.pbtxt").write_text(f'platform: "ensemble"\n{IO}' + STEP % what)
    return root / "addsub_repo", root / "subadd_repo"


X = np.arange(16, dtype=np.int32)
Y = np.ones(16, dtype=np.int32)


def infer(server, model: str) -> str:
    """'addsub' or 'subadd': what the model computes."""
    client = server.http_client()
    inputs = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(Y)
    res = client.infer(model, inputs)
    client.close()
    if np.array_equal(res.as_numpy("OUTPUT0"), X + Y) and np.array_equal(res.as_numpy("OUTPUT1"), X - Y):
        return "addsub"
    assert np.array_equal(res.as_numpy("OUTPUT0"), X - Y) and np.array_equal(res.as_numpy("OUTPUT1"), X + Y)
    return "subadd"


def refused_as_ambiguous(server, model: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        infer(server, model)
    assert AMBIGUOUS in info.value.message(), info.value.message()
    assert f"identifiers of model '{model}'" in info.value.message()


def start(server_factory, tmp_path, monkeypatch, layout: str, mode: str, ready: list[str]):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # (as qa: no __pycache__ appearing in a polled model)
    addsub, subadd = build(tmp_path / "repos", layout)
    extra = ["--model-repository", str(subadd), "--model-namespacing", "true"]
    if mode == "poll":
        extra += ["--repository-poll-secs", "1"]
    server = server_factory(repo=addsub, control_mode=mode, extra_args=extra,
                            wait_ready=ready if mode == "poll" else [])
    return server, addsub, subadd


def load(server, *models: str) -> None:
    client = server.http_client()
    for model in models:
        client.load_model(model)
    client.close()


MODES = ["poll", "explicit"]


@pytest.mark.parametrize("mode", MODES)
def test_no_duplication(server_factory, tmp_path, monkeypatch, mode):
    server, _, _ = start(server_factory, tmp_path, monkeypatch, "no_duplication", mode,
                         ["simple_addsub", "simple_subadd"])
    if mode == "explicit":
        load(server, "simple_addsub", "simple_subadd")  # their composing models load with them
    assert [infer(server, m) for m in ("simple_addsub", "composing_addsub")] == ["addsub"] * 2
    assert [infer(server, m) for m in ("simple_subadd", "composing_subadd")] == ["subadd"] * 2


@pytest.mark.parametrize("mode", MODES)
def test_duplication(server_factory, tmp_path, monkeypatch, mode):
    """Each ensemble reaches the composing_model of its own repository; the name alone is ambiguous."""
    server, _, _ = start(server_factory, tmp_path, monkeypatch, "duplication", mode,
                         ["simple_addsub", "simple_subadd"])
    if mode == "explicit":
        load(server, "simple_addsub", "simple_subadd")
    assert infer(server, "simple_addsub") == "addsub"
    assert infer(server, "simple_subadd") == "subadd"
    refused_as_ambiguous(server, "composing_model")
    client = server.http_client()
    assert client.is_server_ready()
    assert not client.is_model_ready("composing_model")
    index = client.get_model_repository_index()
    assert sorted(r["name"] for r in index if r.get("state") == "READY") == [
        "composing_model", "composing_model", "simple_addsub", "simple_subadd"]
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_ensemble_duplication(server_factory, tmp_path, monkeypatch, mode):
    server, _, _ = start(server_factory, tmp_path, monkeypatch, "ensemble_duplication", mode,
                         ["composing_addsub", "composing_subadd"])
    if mode == "explicit":
        load(server, "simple_ensemble")  # both repositories' ensembles, each with its composing model
    assert infer(server, "composing_addsub") == "addsub"
    assert infer(server, "composing_subadd") == "subadd"
    refused_as_ambiguous(server, "simple_ensemble")


def test_dynamic_resolution_poll(server_factory, harness, tmp_path, monkeypatch):
    """addsub_repo's composing_model goes away: both ensembles use subadd_repo's; it comes back: each its own."""
    server, addsub, _ = start(server_factory, tmp_path, monkeypatch, "duplication", "poll",
                              ["simple_addsub", "simple_subadd"])
    aside = tmp_path / "composing_model"
    shutil.move(addsub / "composing_model", aside)
    harness.wait_for(lambda: infer(server, "simple_addsub") == "subadd", 30, "simple_addsub to use subadd's model")
    assert [infer(server, m) for m in ("simple_subadd", "composing_model")] == ["subadd"] * 2
    shutil.move(aside, addsub / "composing_model")
    harness.wait_for(lambda: infer(server, "simple_addsub") == "addsub", 30, "simple_addsub to use its own again")
    assert infer(server, "simple_subadd") == "subadd"
    refused_as_ambiguous(server, "composing_model")


def test_dynamic_resolution_explicit(server_factory, tmp_path, monkeypatch):
    server, addsub, _ = start(server_factory, tmp_path, monkeypatch, "duplication", "explicit", [])
    aside = tmp_path / "composing_model"
    shutil.move(addsub / "composing_model", aside)
    load(server, "simple_addsub", "simple_subadd")
    assert [infer(server, m) for m in ("simple_subadd", "simple_addsub", "composing_model")] == ["subadd"] * 3
    shutil.move(aside, addsub / "composing_model")
    load(server, "simple_addsub")  # loads its own repository's composing_model again
    assert infer(server, "simple_addsub") == "addsub"
    assert infer(server, "simple_subadd") == "subadd"
    refused_as_ambiguous(server, "composing_model")
