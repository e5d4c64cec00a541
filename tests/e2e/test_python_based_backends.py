"""Python-based backends (python_backend README, "Python-based Backends"; issue 43 item 9): a backend directory
(--backend-directory) holding `<name>/model.py` serves every model whose config says `backend: "<name>"`, as
Triton serves it, so that a backend written for Triton in Python runs unmodified (the server qa
L0_backend_python/python_based_backends checks the same): its model.py and helper modules come from the
backend's directory (imported as the top-level module `model`, the backend directory on sys.path), the model's
own folder in the repository is its model directory (args["model_repository"], get_model_dir() its version
directory, where e.g. vllm_backend reads model.json), its auto_complete_config completes configs that say no
more than the backend's name, and the config gets `runtime: "model.py"`. A model.py in the model's own version
directory is not used. A backend found nowhere fails the load with Triton's words.

The same tests run against Triton 2.51 (INFERD_E2E_TARGET=triton): the test's backend directory holds a `python`
link to the reference's Python backend (the stub and libtriton_python.so) beside the toy backend, and is given
with a later --backend-directory (tritonserver takes the last one), so the reference's own directory is not
touched."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

BACKEND = '''
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

import toy_version                 # <backend dir>/toy_version.py
from toyutils.ops import apply     # <backend dir>/toyutils/ops.py (a package beside model.py, as vllm's utils/)


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        have = {t["name"] for t in config.as_dict()["input"] + config.as_dict()["output"]}
        for name in ("INPUT0", "INPUT1"):
            if name not in have:
                config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        if "OUTPUT" not in have:
            config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        if "INFO" not in have:
            config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.operation = json.load(f)["operation"]
        config = json.loads(args["model_config"])
        factor = config.get("parameters", {}).get("FACTOR", {}).get("string_value", "1")
        self.factor = float(factor)
        self.info = json.dumps({
            "args": {k: v for k, v in args.items() if k != "model_config"},
            "model_dir": pb_utils.get_model_dir(), "module": __name__, "file": __file__,
            "backend_version": toy_version.VERSION, "runtime": config.get("runtime"),
            "backend": config.get("backend"), "max_batch_size": config.get("max_batch_size"),
        })

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out = (apply(self.operation, a, b) * self.factor).astype(np.float32)
            info = np.array([self.info.encode()] * (len(a) if a.ndim == 2 else 1), dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", out),
                pb_utils.Tensor("INFO", info.reshape(out.shape[:-1] + (1,)))]))
        return responses
'''

OPS = '''
import numpy as np


def apply(operation, a, b):
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[operation](a, b)
'''


def reference_python_backend(harness) -> Path:
    where = subprocess.run(["bash", str(harness.TRITON_SCRIPT), "where"], capture_output=True, text=True, check=True)
    return Path(where.stdout.strip()) / "backends" / "python"


def make_backends(root: Path, harness) -> Path:
    backends = root / "backends"
    (backends / "toy" / "toyutils").mkdir(parents=True)
    (backends / "toy" / "model.py").write_text(BACKEND)
    (backends / "toy" / "toy_version.py").write_text("VERSION = '0.1'\n")
    (backends / "toy" / "toyutils" / "__init__.py").write_text("")
    (backends / "toy" / "toyutils" / "ops.py").write_text(OPS)
    if harness.target_is_triton():  # the stub and libtriton_python.so a Python-based backend runs with
        os.symlink(reference_python_backend(harness), backends / "python", target_is_directory=True)
    return backends


def add_model(repo: Path, name: str, config: str, operation: str, versions=(1,)) -> Path:
    for v in versions:
        (repo / name / str(v)).mkdir(parents=True)
        (repo / name / str(v) / "model.json").write_text(json.dumps({"operation": operation}))
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


@pytest.fixture(scope="module")
def layout(tmp_path_factory, harness):
    root = tmp_path_factory.mktemp("pbb")
    backends = make_backends(root, harness)
    repo = root / "models"
    # only the backend's name: auto_complete_config fills in the rest; two versions
    adder = add_model(repo, "adder", 'backend: "toy"\nversion_policy { latest { num_versions: 2 } }\n', "add",
                      versions=(1, 2))
    (adder / "2" / "model.py").write_text("raise SystemExit('the model folder model.py must not run')\n")
    # a full config of its own: batching, a parameter, two instances
    add_model(repo, "scaler", '''
name: "scaler"
backend: "toy"
max_batch_size: 8
dynamic_batching { }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "FACTOR" value: { string_value: "3" } }
''', "mul")
    add_model(repo, "nowhere", 'backend: "nope"\n', "add")
    add_model(repo, "other_runtime", 'backend: "toy"\nruntime: "other.py"\n', "add")
    return backends, repo


@pytest.fixture(scope="module")
def server(module_server_factory, layout):
    backends, repo = layout
    return module_server_factory(repo=repo, wait_ready=["adder", "scaler"],
                                 extra_args=["--backend-directory", str(backends)])


def infer(client_module, client, model: str, shape: list[int], version: str = ""):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    b = np.full(shape, 2.0, np.float32)
    inputs = [client_module.InferInput("INPUT0", shape, "FP32"), client_module.InferInput("INPUT1", shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs, model_version=version)
    return a, b, result.as_numpy("OUTPUT"), json.loads(result.as_numpy("INFO").flat[0])


def test_one_backend_serves_two_models_with_their_own_configs(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        for version in ("1", "2"):
            assert grpc.is_model_ready("adder", version)
            a, b, out, _ = infer(grpcclient, grpc, "adder", [4], version)
            assert np.array_equal(out, a + b)
    http = server.http_client()
    try:
        a, b, out, _ = infer(httpclient, http, "scaler", [3, 4])
        assert np.array_equal(out, a * b * 3)
    finally:
        http.close()


def test_the_model_sees_its_own_folder_and_the_backends_code(server, layout):
    backends, repo = layout
    http = server.http_client()
    try:
        _, _, _, info = infer(httpclient, http, "adder", [4], "2")
        _, _, _, scaler = infer(httpclient, http, "scaler", [1, 4])
    finally:
        http.close()
    assert info["args"]["model_repository"] == str(repo / "adder")
    assert info["args"]["model_name"] == "adder" and info["args"]["model_version"] == "2"
    assert info["args"]["model_instance_kind"] == "CPU"
    assert info["model_dir"] == str(repo / "adder" / "2")
    assert info["module"] == "model" and info["file"] == str(backends / "toy" / "model.py")
    assert info["backend_version"] == "0.1"
    assert info["backend"] == "toy" and info["runtime"] == "model.py"
    assert info["max_batch_size"] == 0 and scaler["max_batch_size"] == 8
    assert scaler["args"]["model_instance_name"] in ("scaler_0_0", "scaler_0_1")


def test_the_config_says_runtime_model_py(server):
    http = server.http_client()
    try:
        config = http.get_model_config("adder")
        assert config["backend"] == "toy" and config["runtime"] == "model.py"
        assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]  # auto-completed by the backend
        assert http.get_model_metadata("scaler")["platform"] == "toy"
    finally:
        http.close()


def test_a_backend_found_nowhere_fails_the_load_with_tritons_words(server, layout):
    backends, repo = layout
    http = server.http_client()
    try:
        rows = {row["name"]: row for row in http.get_model_repository_index() if "version" in row or "reason" in row}
    finally:
        http.close()
    assert rows["nowhere"]["state"] == "UNAVAILABLE"
    assert ("unable to find backend library for backend 'nope', try specifying runtime on the model configuration."
            in rows["nowhere"]["reason"])
    assert (f"unable to find backend library 'other.py' for model 'other_runtime', searched: "
            f"'{repo}/other_runtime/1' '{repo}/other_runtime' '{backends}/toy' ") in rows["other_runtime"]["reason"]
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc, pytest.raises(InferenceServerException):
        infer(grpcclient, grpc, "nowhere", [4])


def test_explicit_load_with_a_config_naming_the_backend(server_factory, tmp_path, harness):
    """As the qa test loads it: load_model(config='{"backend": "<name>", ...}') of a model whose folder holds
    no config."""
    backends = make_backends(tmp_path, harness)
    repo = tmp_path / "models"
    add_model(repo, "sub", "", "sub", versions=(1, 2))
    (repo / "sub" / "config.pbtxt").unlink()
    server = server_factory(repo=repo, control_mode="explicit", extra_args=["--backend-directory", str(backends)])
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        grpc.load_model("sub", config='{"backend":"toy","version_policy":{"latest":{"num_versions":2}}}')
        for version in ("1", "2"):
            assert grpc.is_model_ready("sub", version)
            a, b, out, _ = infer(grpcclient, grpc, "sub", [4], version)
            assert np.array_equal(out, a - b)


@pytest.mark.inferd_only  # inferd's refusal; Triton 2.51 would try to load the library
def test_a_cpp_backend_library_is_refused_by_name(server_factory, tmp_path, harness):
    backends = make_backends(tmp_path, harness)
    (backends / "native").mkdir()
    (backends / "native" / "libtriton_native.so").write_bytes(b"\x7fELF")
    repo = tmp_path / "models"
    add_model(repo, "m", 'backend: "native"\n', "add")
    server = server_factory(repo=repo, wait_ready=[], extra_args=["--backend-directory", str(backends)])
    http = server.http_client()
    try:
        server.wait_until(lambda: any(r.get("reason") for r in http.get_model_repository_index()), 30, "load failed")
        reason = next(r["reason"] for r in http.get_model_repository_index() if r["name"] == "m")
    finally:
        http.close()
    assert "backend 'native' is a C++ backend library" in reason and "cannot load" in reason
