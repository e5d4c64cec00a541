"""Clients for bound models (and any KServe v2 model), built on tritonclient (PyTriton's `pytriton.client`)."""

from .client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)

__all__ = ["AsyncioDecoupledModelClient", "AsyncioModelClient", "DecoupledModelClient", "FuturesModelClient",
           "ModelClient"]
