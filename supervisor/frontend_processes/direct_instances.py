"""A frontend process's own connections to the model workers (the direct path, issue 42).

`DirectPeers` listens on this process's socket in the run dir (a second `instances.channel.Channel`, the
ROUTER end of ZMTP); each worker of a direct version connects to it when the core tells it to (wire
message Attach), with the identity the core gave it. `DirectInstance` is one model instance as this
process's local scheduler sees it (scheduler.base.Executor): a BatchPipeline (instances/pipeline.py, as
in the core) over the connection of the worker the latest snapshot names for it. It is ready while that
worker is named and connected. When the core names another worker (a restart) or none (the instance is
stopping), batches already sent are still answered by the old one; `held` tells when none is left. A
connection lost fails the batches it held (the worker died) and the instance is not ready until the
core names a new worker and it connects.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferRequest
from ..instances import results
from ..instances.channel import Channel
from ..instances.outputs import WorkerOutputs
from ..instances.packing import InputPacker
from ..instances.pipeline import BatchPipeline

log = logging.getLogger("inferd.scaleout")

LOST_GRACE_S = 5.0  # how long a dead worker's batches wait for the core to say why it went (it says so in ms)


class DirectPeers:
    """The listener and the routing of each connected worker's messages to its instance."""

    def __init__(self, run_dir: str) -> None:
        self.channel = Channel(run_dir, name=f"direct-{os.getpid()}.sock")
        self.endpoint = self.channel.endpoint
        self._owners: dict[str, DirectInstance] = {}  # worker identity -> the instance it serves here

    def open(self) -> None:
        self.channel.open()

    def close(self) -> None:
        self.channel.close()

    def bind(self, identity: str, owner: DirectInstance) -> None:
        self._owners[identity] = owner
        self.channel.register(identity, lambda frames: owner.on_message(identity, frames), _no_heartbeat,
                              on_broken=lambda reason: owner.lost(identity, f"broke the worker protocol ({reason})"),
                              on_lost=lambda _ident: owner.lost(identity, "closed its connection"),
                              on_ready=lambda _ident: owner.connected(identity))

    def unbind(self, identity: str) -> None:
        self._owners.pop(identity, None)
        self.channel.unregister(identity)

    def is_connected(self, identity: str) -> bool:
        return self.channel.is_connected(identity)


def _no_heartbeat(frames: list[Any]) -> None:  # workers beat to the core alone
    return None


class DirectInstance:
    """One instance of a direct version, for this frontend's local scheduler (an Executor)."""

    merges_batches = True  # its worker merges the batches waiting for it (scheduler/dynamic.py sends them on)

    def __init__(self, peers: DirectPeers, model_name: str, name: str, model_version: str, depth: int,
                 pool: Any, on_change: Callable[[DirectInstance], None], on_settled: Callable[[], None]) -> None:
        self.name = name
        self.model_name = model_name
        self.identity: str | None = None  # the worker the core names for it now
        self._peers = peers
        self._model_version = model_version
        self._depth = depth
        self._pool = pool
        self._on_change = on_change
        self._on_settled = on_settled  # nothing left on workers it no longer names
        self._pipes: dict[str, BatchPipeline] = {}  # per worker identity: this one's and retiring ones'
        self._pipe: BatchPipeline | None = None
        self._up = False  # the named worker is connected
        self._gone: dict[str, asyncio.TimerHandle] = {}  # closed connections whose batches wait for the why
        self._why: tuple[str, str] = ("", "")  # the last worker the core stopped naming, and why it went

    # ---- the snapshot's view ----
    def name_worker(self, identity: str | None, why: str = "") -> None:
        """The worker the core names for this instance now (None: none ready; `why`: how the last one ended)."""
        if identity == self.identity:
            return
        gone = self._gone.pop(self.identity, None) if self.identity is not None else None
        if gone is not None:  # its connection closed first: its batches fail now, with the core's word for why
            gone.cancel()
            self._fail(self.identity, why or "closed its connection")  # type: ignore[arg-type]
        elif self.identity is not None and why:  # the core saw it go first: its connection's end will say so
            self._why = (self.identity, why)
        self.identity = identity
        self._pipe = None
        self._up = False
        if identity is not None:
            pipe = self._pipes.get(identity)
            if pipe is None:
                pipe = self._pipes[identity] = self._pipeline(identity)
                self._peers.bind(identity, self)
            self._pipe = pipe
            self._up = self._peers.is_connected(identity)
        self._prune()
        self._on_change(self)

    def _pipeline(self, identity: str) -> BatchPipeline:
        send = self._peers.channel.send

        def send_quiet(msg: Any) -> None:
            try:
                send(identity, m.encode(msg))
            except InferdError:
                pass

        outputs = WorkerOutputs(lambda names: send_quiet(m.ReleaseOutputs(names)), "", self.name)
        return BatchPipeline(
            depth=self._depth, packer=InputPacker(self._pool), outputs=outputs, model_version=self._model_version,
            send=lambda frames, hold: send(identity, frames, hold), send_quiet=send_quiet,
            kill=lambda reason: self.lost(identity, reason), refusal=lambda: self._refusal(identity),
            who=lambda: self._who(identity))

    def _prune(self) -> None:
        for identity, pipe in list(self._pipes.items()):
            if identity != self.identity and pipe.held == 0:
                del self._pipes[identity]
                self._peers.unbind(identity)
        if self.held == 0:
            self._on_settled()

    @property
    def inflight(self) -> int:
        return sum(p.inflight for p in self._pipes.values())

    @property
    def held(self) -> int:
        """Batches sent to workers the snapshot no longer names, still to be answered."""
        return sum(p.held for i, p in self._pipes.items() if i != self.identity)

    def close(self, err: InferdError) -> None:
        for timer in self._gone.values():
            timer.cancel()
        self._gone.clear()
        for identity, pipe in self._pipes.items():
            pipe.fail_all(err)
            self._peers.unbind(identity)
        self._pipes.clear()
        self._pipe = None
        self.identity = None
        self._up = False

    # ---- the connection's events ----
    def connected(self, identity: str) -> None:
        if identity == self.identity and not self._up:
            self._up = True
            self._on_change(self)

    def lost(self, identity: str, reason: str) -> None:
        """The worker's connection closed (or it broke the protocol). While the core still names it, its
        batches wait (at most LOST_GRACE_S) for the snapshot that says why it went (a memory cap, a crash), to
        fail with the same words the core's own requests got."""
        if identity == self.identity and identity in self._pipes and identity not in self._gone:
            self._gone[identity] = asyncio.get_running_loop().call_later(
                LOST_GRACE_S, self._fail_gone, identity, reason)
        elif identity not in self._gone:
            self._fail(identity, self._why[1] if self._why[0] == identity else reason)
        if identity == self.identity and self._up:
            self._up = False
            self._on_change(self)

    def _fail_gone(self, identity: str, reason: str) -> None:
        if self._gone.pop(identity, None) is not None:
            self._fail(identity, reason)

    def _fail(self, identity: str, reason: str) -> None:
        pipe = self._pipes.get(identity)
        if pipe is not None:
            text = reason if reason.startswith("model '") else f"{self._who(identity)} {reason}"
            pipe.fail_all(InferdError(ErrorCode.UNAVAILABLE, text))
        if identity != self.identity:
            self._prune()

    def on_message(self, identity: str, frames: list[Any]) -> None:
        pipe = self._pipes.get(identity)
        try:
            msg, data = results.read(frames)
        except m.ProtocolError as exc:
            self.lost(identity, f"sent a malformed message ({exc})")
            return
        cls = type(msg)
        if pipe is None or not (cls is results.PlainResult or cls is m.ExecuteResult or cls is m.ExecuteResultColumns):
            log.warning("unexpected %s from %s", cls.__name__, self._who(identity))
            return
        pipe.on_result(msg, data)
        if identity != self.identity and pipe.held == 0:
            self._prune()

    # ---- Executor ----
    @property
    def ready(self) -> bool:
        return self._up

    async def execute(self, requests: list[InferRequest]) -> Any:
        pipe = self._pipe
        if pipe is None:
            raise self._refusal(self.identity) or InferdError(ErrorCode.UNAVAILABLE, "not ready")
        return await pipe.execute(requests)

    def launch(self, requests: list[InferRequest], on_free: Callable[[], None] | None = None) -> Any:
        pipe = self._pipe
        if pipe is None or not self._up:
            raise self._refusal(self.identity) or InferdError(ErrorCode.UNAVAILABLE, "not ready")
        return pipe.launch(requests, None, on_free)

    def cancel(self, requests: Iterable[InferRequest]) -> None:
        wanted = list(requests)
        for pipe in self._pipes.values():
            pipe.cancel(wanted)

    def _refusal(self, identity: str | None) -> InferdError | None:
        if identity is not None and identity == self.identity and self._up:
            return None
        return InferdError(ErrorCode.UNAVAILABLE, f"{self._who(identity)} is not ready")

    def _who(self, identity: str | None) -> str:
        return f"model '{self.model_name}' instance '{self.name}' (worker {identity or '-'})"
