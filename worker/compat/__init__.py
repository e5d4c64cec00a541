"""Compatibility shims imported by user model code under their Triton names."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

PB_UTILS = "triton_python_backend_utils"
PB_UTILS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), PB_UTILS + ".py")


def load_pb_utils() -> ModuleType:
    """The one `triton_python_backend_utils` module object, shared by the worker and model code.

    Normally the supervisor's staging dir puts it on sys.path under that name; otherwise (tests,
    odd launches) this file's sibling is loaded and registered under the Triton name, so that
    `import triton_python_backend_utils` in model.py finds the same module.
    """
    module = sys.modules.get(PB_UTILS)
    if module is not None:
        return module
    try:
        return importlib.import_module(PB_UTILS)
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(PB_UTILS, PB_UTILS_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PB_UTILS] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(PB_UTILS, None)
        raise
    return module
