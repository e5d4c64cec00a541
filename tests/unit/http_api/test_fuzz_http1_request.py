"""Regressions found by fuzz/targets/http1_request.py (the corpus file named in each test replays it there),
over a real socket to the HTTP server."""

from __future__ import annotations

import logging

import pytest

from .conftest import MAX_INPUT, Served
from .rawhttp import RawConn, build, error_of

UPGRADE = build("GET", "/v2/health/live", b"abc", {"Upgrade": "h2c", "Connection": "Upgrade"})  # (with a body)


@pytest.mark.parametrize("refused", ["over the body cap", "a coding beside Content-Length"])
def test_a_request_refused_after_an_upgrade_gets_its_own_status_not_500(served: Served, refused: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """fuzz/corpus/http1_request/c10fd6a399c1d999: a request refused by a parser callback (an Abort: 413 for a
    body over the cap, 400 for a Transfer-Encoding other than chunked beside a Content-Length) pipelined after
    one that asked for Upgrade was answered 500 "Internal Server Error", with "HTTP parser callback failed"
    logged: the parse after an upgrade ran inside the `except HttpParserUpgrade` block, so httptools' callback
    error carried the upgrade, not the Abort, as its context."""
    if refused == "over the body cap":
        bad = build("POST", "/v2/health/live", headers={"Content-Length": str(MAX_INPUT * 3)})
        status = 413
    else:
        bad = build("POST", "/v2/health/live", b"abc", {"Transfer-Encoding": "gzip", "Content-Length": "3"})
        status = 400
    conn = RawConn(served.port)
    try:
        with caplog.at_level(logging.WARNING, logger="inferd.http"):
            conn.send(UPGRADE + bad)
            assert conn.read_response()[0] == 200  # the upgrade request, answered once with its body read
            got, _, body = conn.read_response()
        assert got == status, error_of(body)
        assert not [r for r in caplog.records if "callback failed" in r.getMessage()]
    finally:
        conn.close()
