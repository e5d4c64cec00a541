"""Clients for bound models (and any KServe v2 model), built on tritonclient (PyTriton's `pytriton.client`)."""

from .client import AsyncioModelClient, DecoupledModelClient, FuturesModelClient, ModelClient

__all__ = ["AsyncioModelClient", "DecoupledModelClient", "FuturesModelClient", "ModelClient"]
