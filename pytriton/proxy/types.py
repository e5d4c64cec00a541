"""`Request`, the mapping an inference callable receives (PyTriton's `pytriton.proxy.types.Request`)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Optional

import numpy as np


class Request(MutableMapping):
    """Input name -> numpy array of one request, with its `parameters` and `requested_output_names`."""

    __slots__ = ("data", "parameters", "requested_output_names", "span")

    def __init__(self, data: dict[str, np.ndarray], parameters: Optional[dict[str, Any]] = None,
                 requested_output_names: Optional[list[str]] = None) -> None:
        self.data = data
        self.parameters = parameters if parameters is not None else {}
        self.requested_output_names = requested_output_names
        self.span = None

    def __getitem__(self, key: str) -> np.ndarray:
        return self.data[key]

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return "Request(%r, parameters=%r)" % (self.data, self.parameters)
