"""A model as one request resolved it: looked up once, then shared by the router, the codec and the data plane.

`DataPlane.model(name, version)` answers a `ModelHandle` (raising what resolving the name raises: an unknown
model or version); the frontends read what they need from it (decoupled, metadata, config) and put it on the
InferRequest they build (`InferRequest.model`), so the data plane submits the request without looking the
name up again. Each data plane has its own kind: the in-process one (core.dataplane_impl.LocalModel) holds
the resolved ModelVersion, a frontend process's (frontend_processes.snapshot) the core's last snapshot of it.

A handle stays correct across an unload or reload: the in-process data plane takes it only while nothing
changed in the registry since it was made, and otherwise resolves the request's name again, as it would
without a handle (the same errors as before handles existed).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any


class ModelHandle(abc.ABC):
    """What the frontends read of a resolved model. `name` and `version` are as the request gave them
    (version "" = the version policy's choice); `metadata()` and `config()` raise as the data plane's
    metadata and config queries do (metadata: UNAVAILABLE for a version that is not ready)."""

    __slots__ = ("name", "version", "decoupled")

    def __init__(self, name: str, version: str, decoupled: bool) -> None:
        self.name = name
        self.version = version
        self.decoupled = decoupled

    @abc.abstractmethod
    def metadata(self) -> dict[str, Any]:
        """{"name", "versions": [str], "platform", "inputs": [{"name","datatype","shape"}], "outputs": [...]}"""

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """The normalised ModelConfig in Triton's JSON rendering."""


class GivenModel(ModelHandle):
    """A handle whose metadata and config come from functions called when asked (a data plane that keeps
    no resolved version: a test's, a fuzz target's)."""

    __slots__ = ("_metadata", "_config")

    def __init__(self, name: str, version: str, decoupled: bool, metadata: Callable[[], dict[str, Any]],
                 config: Callable[[], dict[str, Any]]) -> None:
        super().__init__(name, version, decoupled)
        self._metadata = metadata
        self._config = config

    def metadata(self) -> dict[str, Any]:
        return self._metadata()

    def config(self) -> dict[str, Any]:
        return self._config()
