"""Which backend runs a model (supervisor/repository/python_backends.py): inferd's own, or a Python-based backend
from --backend-directory, with Triton's messages (core TritonModel::GetBackendLibraryProperties) when neither."""

from __future__ import annotations

import pytest
from inferd.supervisor.repository import python_backends
from inferd.supervisor.repository.config import parse_pbtxt
from inferd.worker.wire.errors import ErrorCode, InferdError


@pytest.fixture
def dirs(tmp_path):
    backends = tmp_path / "backends"
    (backends / "toy").mkdir(parents=True)
    (backends / "toy" / "model.py").write_text("class TritonPythonModel: pass\n")
    (backends / "empty").mkdir()
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    return backends, model


def resolve(dirs, text: str):
    backends, model = dirs
    cfg = parse_pbtxt('name: "m"\n' + text)
    return cfg, python_backends.resolve(cfg, str(model), 1, str(backends))


@pytest.mark.parametrize("backend", ["python", "onnxruntime", "pytorch", "tensorrt", "external"])
def test_inferds_own_backends_run_themselves(dirs, backend):
    cfg, where = resolve(dirs, f'backend: "{backend}"')
    assert where == "" and cfg.runtime == ""
    cfg, where = resolve(dirs, f'backend: "{backend}" runtime: "libtriton_{backend}.so"')
    assert where == ""


def test_a_backend_directory_with_model_py_is_a_python_based_backend(dirs):
    backends, _ = dirs
    cfg, where = resolve(dirs, 'backend: "toy"')
    assert where == str(backends / "toy")
    assert cfg.runtime == "model.py"  # as Triton's core sets it
    assert "EXECUTION_ENV_PATH" not in cfg.parameters
    cfg, where = resolve(dirs, 'backend: "toy" runtime: "model.py"')
    assert where == str(backends / "toy")


def test_the_backends_packed_environment_is_used_unless_the_model_names_one(dirs):
    backends, _ = dirs
    (backends / "toy" / "pb_exec_env_model.py.tar.gz").write_bytes(b"")
    cfg, _ = resolve(dirs, 'backend: "toy"')
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value == str(backends / "toy" / "pb_exec_env_model.py.tar.gz")
    cfg, _ = resolve(dirs, 'backend: "toy" parameters { key: "EXECUTION_ENV_PATH" value { string_value: "own" } }')
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value == "own"


@pytest.mark.parametrize("backend", ["nope", "empty"])
def test_no_backend_found_is_tritons_load_error(dirs, backend):
    with pytest.raises(InferdError) as info:
        resolve(dirs, f'backend: "{backend}"')
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == (f"unable to find backend library for backend '{backend}', try specifying runtime "
                                  "on the model configuration.")


def test_a_runtime_that_is_not_found_names_where_it_was_looked_for(dirs):
    backends, model = dirs
    with pytest.raises(InferdError) as info:
        resolve(dirs, 'backend: "toy" runtime: "other.py"')
    assert info.value.message == (f"unable to find backend library 'other.py' for model 'm', searched: '{model}/1' "
                                  f"'{model}' '{backends}/toy' ")
    with pytest.raises(InferdError) as info:
        resolve(dirs, 'backend: "empty" runtime: "model.py"')
    assert info.value.message == ("unable to find Python backend based backend library 'model.py' for model 'm', "
                                  f"searched: '{backends}/empty/model.py'")


def test_a_cpp_backend_library_is_refused_by_name(dirs):
    backends, model = dirs
    (backends / "empty" / "libtriton_empty.so").write_bytes(b"\x7fELF")
    with pytest.raises(InferdError) as info:
        resolve(dirs, 'backend: "empty"')
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert "backend 'empty' is a C++ backend library" in info.value.message
    assert "libtriton_empty.so" in info.value.message
    (model / "1" / "custom.so").write_bytes(b"\x7fELF")
    with pytest.raises(InferdError, match="C\\+\\+ backend library .*custom.so"):
        resolve(dirs, 'backend: "toy" runtime: "custom.so"')


@pytest.mark.parametrize("backend", ["../outside", "toy/../../outside", "..", "/abs/outside"])
def test_a_backend_name_cannot_leave_the_backend_directory(dirs, backend):
    backends, _ = dirs
    (backends.parent / "outside").mkdir()
    (backends.parent / "outside" / "model.py").write_text("class TritonPythonModel: pass\n")
    with pytest.raises(InferdError, match="is not a backend name") as err:
        resolve(dirs, f'backend: "{backend}"')
    assert err.value.code == ErrorCode.INVALID_ARG


def test_runs_python():
    assert python_backends.runs_python({"backend": "python"})
    assert python_backends.runs_python({"backend": "toy", "runtime": "model.py"})
    assert not python_backends.runs_python({"backend": "onnxruntime", "runtime": ""})
