"""The server's side of gRPC's connection management for one HTTP/2 connection, from tritonserver's
--grpc-keepalive-* and --grpc-max-connection-age(-grace): keepalive PINGs to a quiet client (the
connection is dropped when it does not answer) and a maximum connection age (GOAWAY, then a grace
period for the running calls).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import frames as f

log = logging.getLogger("inferd.grpc")

# opaque data of the PINGs we send, to tell their ACKs apart
_KEEPALIVE_PING = b"inferdKA"
_RETIRE_PING = b"inferdGA"
RETIRE_ACK_WAIT_S = 10.0  # the final GOAWAY goes out then even if the client never answers the PING


@dataclass(frozen=True)
class Lifetime:
    """Connection management in seconds (None: off)."""

    ping_interval: float | None = None  # PING a client that sent nothing for this long
    ping_timeout: float = 20.0  # and drop the connection if the ACK takes longer
    ping_idle: bool = False  # PING connections without running calls too
    max_age: float | None = None  # then GOAWAY (±10 % so that clients do not all reconnect at once)
    max_age_grace: float | None = None  # running calls then get this long; None: as long as they take


class ConnectionLifetime:
    """The timers of one connection (`conn`: an H2Connection, which sets `conn.heard` on every read)."""

    def __init__(self, conn: Any, settings: Lifetime) -> None:
        self.conn = conn
        self.settings = settings
        self._timers: dict[str, asyncio.TimerHandle] = {}  # "ping", "age", "goaway", "grace"

    def start(self) -> None:
        settings = self.settings
        if settings.ping_interval:
            self._later("ping", settings.ping_interval, self._keepalive)
        if settings.max_age:
            self._later("age", settings.max_age * random.uniform(0.9, 1.1), self.retire)

    def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def on_ping_ack(self, opaque: bytes) -> None:
        if opaque == _KEEPALIVE_PING and self.settings.ping_interval:
            self.conn.heard = False  # the ACK itself does not postpone the next PING
            self._later("ping", self.settings.ping_interval, self._keepalive)
        elif opaque == _RETIRE_PING:
            timer = self._timers.pop("goaway", None)
            if timer is not None:
                timer.cancel()
                self.conn.goaway()

    def retire(self) -> None:
        """The connection reached its maximum age: the client is to open a new one for new calls.

        Two GOAWAYs, as gRPC servers send them: the first names the highest possible stream and comes
        with a PING; once the client has answered that PING it has seen the GOAWAY, so the second,
        naming the last stream it opened, refuses no call it started in between. Running calls go on
        for the grace period; then the connection is closed under them.
        """
        conn = self.conn
        if conn.closing or not self._open() or "goaway" in self._timers:
            return
        conn._write(f.goaway(f.MAX_STREAM_ID, f.NO_ERROR) + f.ping(_RETIRE_PING))
        self._later("goaway", RETIRE_ACK_WAIT_S, conn.goaway)
        if self.settings.max_age_grace is not None:
            self._later("grace", self.settings.max_age_grace, self._grace_over)

    # ---- timers ----
    def _later(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        self._timers[name] = asyncio.get_running_loop().call_later(delay, callback)

    def _open(self) -> bool:
        transport = self.conn.transport
        return transport is not None and not transport.is_closing()

    def _keepalive(self) -> None:
        """The ping interval passed: PING the client unless it spoke meanwhile (or has no calls
        running and idle connections are not pinged); no ACK within the timeout drops the connection."""
        conn, settings = self.conn, self.settings
        assert settings.ping_interval
        if not self._open():
            return
        if conn.heard or not (conn.streams or settings.ping_idle):
            conn.heard = False
            self._later("ping", settings.ping_interval, self._keepalive)
            return
        conn._write(f.ping(_KEEPALIVE_PING))
        self._later("ping", settings.ping_timeout, self._ping_unanswered)

    def _ping_unanswered(self) -> None:
        log.info("closing gRPC connection: keepalive PING not answered")
        self.conn.abort()

    def _grace_over(self) -> None:
        if self.conn.streams:
            log.info("closing gRPC connection at its maximum age: %d calls still running after the grace period",
                     len(self.conn.streams))
        self.conn.abort()
