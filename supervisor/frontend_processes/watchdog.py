"""Hung frontend processes are killed (and so restarted): a stopped frontend must not leave its clients hanging.

Every `interval` the core PINGs each frontend; a frontend whose link has carried nothing for `deadline`
seconds (no PONG, no request) is killed with SIGKILL, which processes.py notices and answers with a new
process. A frontend runs no model code, so a healthy one answers within a loop pass; the deadline is
still generous (at least MIN_DEADLINE_S). A check that finds the core's own loop was late (it slept far
past its interval) judges nobody that round: the frames may be waiting unread here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from .frames import Kind
from .publisher import Publisher, Session

log = logging.getLogger("inferd.scaleout")

MIN_DEADLINE_S = 5.0


async def watch(publisher: Publisher, interval: float, deadline: float) -> None:
    deadline = max(MIN_DEADLINE_S, deadline)
    loop = asyncio.get_running_loop()
    last = loop.time()
    blocked_since: dict[Session, float] = {}
    while True:
        await asyncio.sleep(interval)  # a timer between checks, as the workers' heartbeats
        now = loop.time()
        late = now - last > 2 * interval + 1.0
        last = now
        for gone in [s for s in blocked_since if s not in publisher.sessions]:
            del blocked_since[gone]
        for session in list(publisher.sessions):
            # while the core does not read it (its answers pile up unread there) its PONGs may be waiting:
            # it is judged on reading the core's frames instead, with three times the deadline
            limit = deadline
            if session.link.blocked:
                blocked_since.setdefault(session, now)
                limit = 3 * deadline
                silent = now - blocked_since[session]
            else:
                if blocked_since.pop(session, None) is not None:
                    session.last_seen = now  # read again from now on: judged afresh
                silent = now - session.last_seen
            if not late and silent > limit and session.regions.pid:
                log.error("frontend process %d silent for %.1fs: killing it (it is started again)",
                          session.regions.pid, silent)
                blocked_since.pop(session, None)
                try:
                    os.kill(session.regions.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                session.link.close()
                continue
            session.link.send(Kind.PING, 0, b"")
