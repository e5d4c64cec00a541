"""Importing a Python model's file as Triton's stub does.

- A model of backend "python": `<model_dir>/<version>/<default_model_filename or model.py>`.
  `<model_dir>/<version>` and `<model_dir>` are appended to sys.path so helper modules beside model.py
  import; the file is a module of a package whose path is the version directory, as Triton imports
  `<version>.model` (`from .helper import x` finds <version>/helper.py), under a package name unique per
  model file, so two models' model.py never share a module (nor a stale one).
- A Python-based backend's model (python_backend README, "Python-based Backends"): `<backend_dir>/model.py`,
  imported as the top-level module `model` with the backend's directory on sys.path (its helper modules and
  packages import beside it), as the stub imports it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any

from ..wire.errors import ErrorCode, InferdError

DEFAULT_MODEL_FILENAME = "model.py"


def import_model(spec: Any, on_failure: Callable[[str], None]) -> tuple[Any, str]:
    """(module, path) of the model's code; InferdError when it is missing or does not import (then
    `on_failure(what)` ran first, inside the handler, so it may log the traceback)."""
    if spec.backend_dir:
        path = os.path.join(spec.backend_dir, DEFAULT_MODEL_FILENAME)
        _exists(path)
        _on_path(spec.backend_dir)
        return _load("model", path, None, on_failure), path
    version_dir = os.path.join(spec.model_dir, spec.version)
    filename = spec.config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
    if not filename.endswith(".py") or os.sep in filename:
        raise InferdError(
            ErrorCode.INVALID_ARG, "Model name must end with '.py'. Model name is \"%s\"." % filename
        )
    path = os.path.join(version_dir, filename)
    _exists(path)
    _on_path(version_dir, spec.model_dir)
    digest = hashlib.sha1(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:10]
    package = "inferd_model_%s_%s_%s" % (
        re.sub(r"\W", "_", spec.model_name), re.sub(r"\W", "_", spec.version), digest
    )
    module_name = package + "." + filename[: -len(".py")]
    module = sys.modules.get(module_name)
    if module is not None:
        return module, path
    parent = types.ModuleType(package)
    parent.__path__ = [version_dir]
    return _load(module_name, path, parent, on_failure), path


def _exists(path: str) -> None:
    if not os.path.isfile(path):
        raise InferdError(ErrorCode.NOT_FOUND, "Python model file not found in '%s'" % path)


def _on_path(*entries: str) -> None:
    for entry in entries:
        if entry not in sys.path:
            sys.path.append(entry)


def _load(module_name: str, path: str, parent: Any, on_failure: Callable[[str], None]) -> Any:
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise InferdError(ErrorCode.INTERNAL, "cannot import Python model file '%s'" % path)
    module = importlib.util.module_from_spec(module_spec)
    if parent is not None:
        sys.modules[parent.__name__] = parent
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if parent is not None:
            sys.modules.pop(parent.__name__, None)
        on_failure("importing %s" % path)
        raise InferdError(ErrorCode.INTERNAL, "%s: %s" % (type(exc).__name__, exc)) from None
    if not isinstance(getattr(module, "TritonPythonModel", None), type):
        sys.modules.pop(module_name, None)
        raise InferdError(
            ErrorCode.INTERNAL,
            "AttributeError: Python model file '%s' does not define class 'TritonPythonModel'" % path,
        )
    return module
