"""The snapshot publisher: builds the core's snapshot (snapshot.py) after each change and pushes it to every
frontend session (core_link.Session); `sync()` returns once every frontend has acknowledged the latest one (a
load, unload or shm registration answers only then; a worker stops only then, `detach`). It also keeps the
direct path's part of the core (direct_core.py): the workers' Attach to every frontend's listener, and the
statistics pull that every statistics, status and metrics answer waits for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Protocol

from ..core.dataplane_impl import ServerDataPlane
from ..tracing import live
from . import direct_core, frames, snapshot
from .frames import Kind
from .link import Link

log = logging.getLogger("inferd.scaleout")

PULL_TIMEOUT_S = 2.0  # a frontend that does not send its statistics by then is left out of that answer (logged)
SYNC_TIMEOUT_S = 10.0  # a frontend that does not acknowledge a snapshot by then is left behind (and logged)


class Session(Protocol):
    """What the publisher reads of a frontend's session (core_link.Session)."""

    link: Link
    acked: int  # the latest snapshot version it applied
    serving: bool  # its servers listen
    direct_endpoint: str  # its listener for the workers (direct path), or ""
    direct_inflight: dict[tuple[int, str], int]
    direct_pending: dict[int, int]
    last_seen: float  # loop time of its last frame (watchdog.py)
    regions: Any  # its input regions mapped in the core: `.pid` is the frontend process's (watchdog.py)


class Publisher:
    """Builds the snapshot after each change and pushes it to every frontend."""

    def __init__(self, dp: ServerDataPlane) -> None:
        self.dp = dp
        self.sessions: set[Session] = set()
        self.version = 0
        self._doc: bytes = b""
        self._dirty = True
        self._scheduled = False
        self._acked: asyncio.Event = asyncio.Event()
        self.attacher = direct_core.Attacher()
        self._pulls: dict[int, tuple[set[Session], asyncio.Future[None]]] = {}
        self._pull_ids = itertools.count(1)

    def add(self, session: Session) -> None:
        self.sessions.add(session)
        self._flush()
        session.link.send(Kind.SNAPSHOT, 0, self._doc)
        self._attach()

    def remove(self, session: Session) -> None:
        self.sessions.discard(session)
        self._acked.set()
        for pull in list(self._pulls):
            self.pulled(session, pull)
        self._attach()

    def _attach(self) -> None:
        """Every ready worker of a direct version connects to every frontend's listener (once per pair)."""
        self.attacher.sync(self.dp, [s.direct_endpoint for s in self.sessions])

    async def pull_stats(self) -> None:
        """Return once every frontend has sent the statistics of its direct requests (bounded: PULL_TIMEOUT_S)."""
        sessions = {s for s in self.sessions if s.direct_endpoint}
        if not sessions:
            return
        call = next(self._pull_ids)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pulls[call] = (sessions, done)
        for session in sessions:
            session.link.send(Kind.STATS_PULL, call, b"")
        try:
            await asyncio.wait_for(asyncio.shield(done), PULL_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("a frontend process did not send its statistics in %.0fs", PULL_TIMEOUT_S)
        finally:
            self._pulls.pop(call, None)

    def direct_inflight(self, serial: int, instance: str) -> int:
        return sum(s.direct_inflight.get((serial, instance), 0) for s in self.sessions)

    def direct_pending(self, serial: int) -> int:
        return sum(s.direct_pending.get(serial, 0) for s in self.sessions)

    def pulled(self, session: Session, call: int) -> None:
        pull = self._pulls.get(call)
        if pull is not None:
            pull[0].discard(session)
            if not pull[0] and not pull[1].done():
                pull[1].set_result(None)

    async def detach(self, identity: str) -> None:
        """Before a worker stops: every frontend has a snapshot that no longer names it and has had its
        batches there answered (direct_models.DirectModels.apply)."""
        if any(s.direct_endpoint for s in self.sessions):
            await self.sync()

    def changed(self, *_: Any) -> None:
        """Something the snapshot shows may have changed: push a new one soon (once per loop turn)."""
        self._dirty = True
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._dirty:
            return
        self._dirty = False
        self.version += 1
        self._doc = frames.dumps(snapshot.build(self.dp, self.version, live.armed))
        for session in self.sessions:
            session.link.send(Kind.SNAPSHOT, 0, self._doc)
        self._attach()

    def acked(self) -> None:
        self._acked.set()

    async def serving(self, count: int, timeout: float) -> bool:
        """Whether `count` frontends listen within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while sum(s.serving for s in self.sessions) < count:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._acked.clear()
            try:
                await asyncio.wait_for(self._acked.wait(), left)
            except asyncio.TimeoutError:
                continue
        return True

    async def sync(self) -> None:
        """Push what changed now, and return once every frontend has applied it (or SYNC_TIMEOUT_S passed)."""
        self._dirty = True
        self._flush()
        target = self.version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SYNC_TIMEOUT_S
        while any(s.acked < target for s in self.sessions):
            left = deadline - loop.time()
            if left <= 0:
                log.warning("a frontend process did not acknowledge the server state in %.0fs", SYNC_TIMEOUT_S)
                return
            self._acked.clear()
            try:
                await asyncio.wait_for(self._acked.wait(), left)
            except asyncio.TimeoutError:
                continue
