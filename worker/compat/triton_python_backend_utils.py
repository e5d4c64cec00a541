"""`triton_python_backend_utils` for inferd workers: the public surface Triton's Python backend gives
`model.py` (imported there as `import triton_python_backend_utils as pb_utils`).

The supervisor puts this file on the worker's path under its Triton name; the worker imports it by
that same name, so model code and the worker share one module object (one `InferenceResponse`
class). Plain and decoupled models, BLS (`exec`/`async_exec`, decoupled iterators), model control from
Python (load_model, unload_model, is_model_ready) and custom metrics (MetricFamily, on the server's
/metrics) are supported; what is not (docs/python-backend.md "Not supported, and why") raises
TritonModelException "... is not supported yet by inferd" where a call reaches it.

This module is the face only: the bodies live in the private modules beside it, which it re-exports.

    _pb_base.py      constants, TritonError, TritonModelException, get_model_dir, the worker's _configure
    _pb_tensor.py    Tensor: host and device arrays, DLPack both ways
    _pb_response.py  InferenceResponse, InferenceResponseSender, get_output_tensor_by_name
    _pb_request.py   InferenceRequest (execute's requests; BLS exec/async_exec), PreferredMemory, MemoryType,
                     InferenceTrace, get_input_tensor_by_name
    _pb_bls.py       the BLS response iterator and replies; load_model, unload_model, is_model_ready
    _pb_logger.py    Logger, LogLevel
    _pb_metrics.py   MetricFamily, Metric
    _pb_types.py     datatype tables and conversions, BYTES tensor (de)serialization
    _pb_config.py    ModelConfig (auto_complete_config), model configuration look-ups

Runs on Python 3.9+ with numpy only (+ inferd.worker.wire).
"""

from __future__ import annotations

# Not used here: kept so that `from triton_python_backend_utils import *` brings the same names as when
# this module held the bodies (Triton's own module also lends its imports, json and np, to `import *`).
import enum  # noqa: F401
import json  # noqa: F401
import os  # noqa: F401
import sys  # noqa: F401
import threading  # noqa: F401
import time  # noqa: F401
import weakref  # noqa: F401
from collections.abc import Callable  # noqa: F401
from typing import Any, Optional  # noqa: F401

import numpy as np  # noqa: F401
from inferd.worker.compat._pb_base import (
    TRITONSERVER_MEMORY_CPU as TRITONSERVER_MEMORY_CPU,
)
from inferd.worker.compat._pb_base import (
    TRITONSERVER_MEMORY_GPU as TRITONSERVER_MEMORY_GPU,
)
from inferd.worker.compat._pb_base import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END as TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
)
from inferd.worker.compat._pb_base import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START as TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
)
from inferd.worker.compat._pb_base import (
    TRITONSERVER_REQUEST_RELEASE_ALL as TRITONSERVER_REQUEST_RELEASE_ALL,
)
from inferd.worker.compat._pb_base import (
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE as TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
)
from inferd.worker.compat._pb_base import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL as TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)
from inferd.worker.compat._pb_base import TritonError as TritonError
from inferd.worker.compat._pb_base import TritonModelException as TritonModelException
from inferd.worker.compat._pb_base import _configure as _configure  # the worker's call before model.py
from inferd.worker.compat._pb_base import _state as _state  # the worker sets "bls_allowed"
from inferd.worker.compat._pb_base import get_model_dir as get_model_dir
from inferd.worker.compat._pb_bls import _ResponseIterator as _ResponseIterator  # reaches models: exec(decoupled=True)
from inferd.worker.compat._pb_bls import is_model_ready as is_model_ready
from inferd.worker.compat._pb_bls import load_model as load_model
from inferd.worker.compat._pb_bls import unload_model as unload_model
from inferd.worker.compat._pb_config import ModelConfig as ModelConfig
from inferd.worker.compat._pb_config import get_input_config_by_name as get_input_config_by_name
from inferd.worker.compat._pb_config import get_output_config_by_name as get_output_config_by_name
from inferd.worker.compat._pb_config import (
    using_decoupled_model_transaction_policy as using_decoupled_model_transaction_policy,
)
from inferd.worker.compat._pb_logger import Logger as Logger
from inferd.worker.compat._pb_logger import LogLevel as LogLevel
from inferd.worker.compat._pb_metrics import Metric as Metric
from inferd.worker.compat._pb_metrics import MetricFamily as MetricFamily
from inferd.worker.compat._pb_request import InferenceRequest as InferenceRequest
from inferd.worker.compat._pb_request import InferenceResponseSender as InferenceResponseSender
from inferd.worker.compat._pb_request import InferenceTrace as InferenceTrace
from inferd.worker.compat._pb_request import MemoryType as MemoryType
from inferd.worker.compat._pb_request import PreferredMemory as PreferredMemory
from inferd.worker.compat._pb_request import get_input_tensor_by_name as get_input_tensor_by_name
from inferd.worker.compat._pb_response import InferenceResponse as InferenceResponse
from inferd.worker.compat._pb_response import get_output_tensor_by_name as get_output_tensor_by_name
from inferd.worker.compat._pb_tensor import Tensor as Tensor
from inferd.worker.compat._pb_tensor import _DLPackCapsule as _DLPackCapsule
from inferd.worker.compat._pb_types import TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY
from inferd.worker.compat._pb_types import deserialize_bytes_tensor as deserialize_bytes_tensor
from inferd.worker.compat._pb_types import numpy_to_triton_type as numpy_to_triton_type
from inferd.worker.compat._pb_types import serialize_byte_tensor as serialize_byte_tensor
from inferd.worker.compat._pb_types import triton_string_to_numpy as triton_string_to_numpy
from inferd.worker.compat._pb_types import triton_to_numpy_type as triton_to_numpy_type
from inferd.worker.wire import bytes_codec, dtypes  # noqa: F401 - `import *`, as above


def _claim(names: dict[str, Any]) -> None:
    """Give the re-exported classes and functions this module as their home (`__module__`), as when they
    were defined here: pickle finds them under the name model code imports, and reprs and help() read
    `triton_python_backend_utils.Tensor`, not a private module."""
    for value in list(names.values()):
        if getattr(value, "__module__", "").startswith("inferd.worker.compat._pb_"):
            value.__module__ = __name__


_claim(globals())
