"""`inferd.pytriton.proxy.types.Request`, as PyTriton's `pytriton.proxy.types`."""

from .types import Request

__all__ = ["Request"]
