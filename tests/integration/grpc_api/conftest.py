"""Our gRPC frontend over an in-test DataPlane, in a subprocess: the tests run against both
implementations, inferd's own HTTP/2 server (the default) and grpcio's grpc.aio server.

The server runs in its own process because our generated protos and tritonclient's share names
(DESIGN.md, Known traps); this process imports only tritonclient.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._spawn import serve


@pytest.fixture(scope="session", params=["native", "grpcio"])
def grpc_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from serve(request.param)


@pytest.fixture(scope="session")
def native_url() -> Iterator[str]:
    """inferd's own HTTP/2 server only (for tests that speak raw HTTP/2 to it)."""
    yield from serve("native")
