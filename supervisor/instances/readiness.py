"""A model's own readiness check (`is_ready()`, python_backend after Triton 2.51), asked of its workers.

A worker whose LoadResult says `readiness` answers ReadinessProbes on its `<identity>/ready` socket
(worker/readiness.py); every other worker has no such socket and is never asked. python_backend's rules
(python_be.cc, RunUserModelReadinessCheck), kept here:
- a check answers within TIMEOUT_S or the request asking is answered "not ready"; the check goes on;
- one check in flight per instance: a readiness request that comes meanwhile waits for it (up to TIMEOUT_S
  of its own) and takes its answer, so a check that outlived its first asker still answers the next one;
- an error (is_ready() raised or returned no bool), a dead worker or False is "not ready".
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import InferdError

from .channel import Channel

log = logging.getLogger("inferd.instances.readiness")

TIMEOUT_S = 5.0  # python_backend's kUserModelReadinessTimeoutMs
READY_SUFFIX = "/ready"
Answer = tuple[bool, str]  # (ready, why not: "" when the check itself said False)


class WorkerReadiness:
    """One worker's is_ready() socket: its greeting, the check in flight and its answer."""

    def __init__(self, send: Callable[[Any], None]) -> None:
        self._send = send
        self.connected = asyncio.Event()  # the worker's greeting came: probes can reach it
        self._inflight: asyncio.Future[Answer] | None = None
        self._seq = 0

    async def check(self, timeout: float = TIMEOUT_S) -> Answer:
        """Ask is_ready() (or wait for the check in flight); answers within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        future = self._inflight
        late = "Timed out waiting for in-flight is_ready() response"
        if future is None:
            future = self._inflight = loop.create_future()
            late = "Timed out waiting for user-defined is_ready() response"
            try:
                if not self.connected.is_set():
                    await asyncio.wait_for(self.connected.wait(), timeout)
                self._seq += 1
                self._send(m.ReadinessProbe(self._seq))
            except (asyncio.TimeoutError, InferdError) as exc:
                why = late if isinstance(exc, asyncio.TimeoutError) else exc.message
                self._settle(future, (False, why))
                return False, why
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            return False, late

    def on_result(self, message: m.ReadinessResult) -> None:
        if message.seq == 0:
            self.connected.set()
            return
        future = self._inflight
        if future is None or message.seq != self._seq:
            return  # an answer nobody waits for any more
        error = message.error
        self._settle(future, (False, error.message) if error is not None else (bool(message.ready), ""))

    def gone(self, why: str) -> None:
        """The worker exited: a check in flight answers "not ready"."""
        if self._inflight is not None:
            self._settle(self._inflight, (False, why))

    def _settle(self, future: asyncio.Future[Answer], answer: Answer) -> None:
        if self._inflight is future:
            self._inflight = None
        if not future.done():
            future.set_result(answer)


class _Router:
    """The `<identity>/ready` sockets of one channel's workers."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.workers: dict[str, WorkerReadiness] = {}
        channel.route_suffix(READY_SUFFIX, self._on_message, self._on_gone)

    def get(self, identity: str) -> WorkerReadiness:
        state = self.workers.get(identity)
        if state is None:  # (the greeting may come before the LoadResult that announces the socket)
            target = identity + READY_SUFFIX
            state = self.workers[identity] = WorkerReadiness(
                lambda message: self.channel.send(target, m.encode(message)))
        return state

    def _on_message(self, ident: str, frames: list[Any]) -> None:
        try:
            message, _ = m.decode(frames)
        except m.ProtocolError as exc:
            log.warning("worker '%s' sent a malformed readiness message: %s", ident, exc)
            return
        if isinstance(message, m.ReadinessResult):
            self.get(ident[: -len(READY_SUFFIX)]).on_result(message)

    def _on_gone(self, identity: str) -> None:
        state = self.workers.pop(identity, None)
        if state is not None:
            state.gone("Stub process is not healthy while waiting for user-defined is_ready() response")


_routers: weakref.WeakKeyDictionary[Channel, _Router] = weakref.WeakKeyDictionary()


def for_worker(channel: Channel, identity: str) -> WorkerReadiness:
    """The readiness state of worker `identity` on `channel` (its socket's messages routed there)."""
    router = _routers.get(channel)
    if router is None:
        router = _routers[channel] = _Router(channel)
    return router.get(identity)


def listen(channel: Channel) -> None:
    """Route `<identity>/ready` messages of `channel` from now on (before workers start: a greeting that
    comes before its worker's LoadResult is kept)."""
    if channel not in _routers:
        _routers[channel] = _Router(channel)
