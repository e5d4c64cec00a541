"""Which code runs a model: one of inferd's own backends, or a Python-based backend from --backend-directory
(python_backend README, "Python-based Backends"), decided as Triton's core decides it
(TritonModel::GetBackendLibraryProperties).

A Python-based backend is a directory `<backend dir>/<name>/` holding a `model.py` (a TritonPythonModel class,
helper modules beside it); every model whose config says `backend: "<name>"` runs it with the python backend,
its own folder in the repository as its model directory (args["model_repository"], get_model_dir() its
version directory), and its config gets `runtime: "model.py"`, as in Triton. For a backend name inferd does
not have, Triton looks for `libtriton_<name>.so` (in the version directory, the model directory, then
`<backend dir>/<name>`) before `model.py`: inferd refuses such a C++ backend by name, and answers a name with
neither with Triton's message. A `runtime` naming another file is looked for where Triton looks.
"""

from __future__ import annotations

import os
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

DEFAULT_DIRECTORY = "/opt/tritonserver/backends"  # tritonserver's --backend-directory default
PYTHON_RUNTIME = "model.py"
# the backends inferd runs itself ("external": the Python API's models, instances/external.py)
BUILT_IN = frozenset(("python", "onnxruntime", "pytorch", "tensorrt", "vllm", "external"))
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"


def _library(backend: str) -> str:
    return "libtriton_%s.so" % backend


def _invalid(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


def resolve(cfg: Any, model_path: str, version: int, backend_directory: str) -> str:
    """The directory of the Python-based backend that runs the model of config `cfg` (a ModelConfig proto,
    backend filled in), "" when one of inferd's own backends runs it. For a Python-based backend the config
    gets `runtime: "model.py"` and, without an EXECUTION_ENV_PATH of its own, the backend's
    `pb_exec_env_model.py.tar.gz` when the backend directory holds one (as Triton's core sets them).
    InferdError (INVALID_ARG) with Triton's words when no backend is found."""
    backend, runtime = cfg.backend, cfg.runtime
    if not backend or (backend in BUILT_IN and runtime in ("", PYTHON_RUNTIME, _library(backend))):
        return ""
    if "/" in backend or backend in (".", ".."):
        # a config given through the load API must not run a model.py from outside --backend-directory
        raise _invalid("model '%s': backend '%s' is not a backend name (a folder of the backend directory)"
                       % (cfg.name, backend))
    backend_dir = os.path.join(backend_directory, backend)
    search = [os.path.join(model_path, str(version)), model_path, backend_dir]
    if runtime == PYTHON_RUNTIME:
        path = os.path.join(backend_dir, PYTHON_RUNTIME)
        if not os.path.isfile(path):
            raise _invalid("unable to find Python backend based backend library '%s' for model '%s', searched: "
                           "'%s'" % (PYTHON_RUNTIME, cfg.name, path))
    elif runtime:
        found = next((p for p in (os.path.join(d, runtime) for d in search) if os.path.isfile(p)), None)
        if found is None:
            raise _invalid("unable to find backend library '%s' for model '%s', searched: %s" % (
                runtime, cfg.name, "".join("'%s' " % d for d in search)))
        raise _cpp(cfg.name, backend, found)
    else:
        found = next((p for p in (os.path.join(d, _library(backend)) for d in search) if os.path.isfile(p)), None)
        if found is not None:
            raise _cpp(cfg.name, backend, found)
        if not os.path.isfile(os.path.join(backend_dir, PYTHON_RUNTIME)):
            raise _invalid("unable to find backend library for backend '%s', try specifying runtime on the model "
                           "configuration." % backend)
        cfg.runtime = PYTHON_RUNTIME
    env = os.path.join(backend_dir, "pb_exec_env_%s.tar.gz" % PYTHON_RUNTIME)
    if EXECUTION_ENV_PATH not in cfg.parameters and os.path.isfile(env):
        cfg.parameters[EXECUTION_ENV_PATH].string_value = env
    return backend_dir


def _cpp(model: str, backend: str, path: str) -> InferdError:
    return InferdError(ErrorCode.UNSUPPORTED, "model '%s': backend '%s' is a C++ backend library ('%s'), which "
                       "inferd cannot load; it runs its own backends (python, onnxruntime, pytorch, tensorrt, vllm) "
                       "and Python-based backends (<backend directory>/%s/%s)" % (model, backend, path, backend,
                                                                             PYTHON_RUNTIME))


def runs_python(config: dict[str, Any]) -> bool:
    """Whether the python backend runs a model of this (JSON) config: backend "python" or a Python-based one."""
    return config.get("backend") == "python" or config.get("runtime") == PYTHON_RUNTIME
