"""The direct versions as one frontend process serves them (issue 42): a local scheduler per version.

The snapshot's "direct" section (direct_core.section) lists the versions whose requests this process may
send straight to their workers. Each gets its own scheduler here, made by the core's factory from the
same config (scheduler/factory.py: the default scheduler, or the dynamic batcher with its priorities, queue
policies and delays), over `DirectInstance`s, recording into a `stats_relay.Recorder`. So batches form, and
queue bounds and timeouts hold, per frontend process (the worker merges batches that wait for it, which
brings back the batches a single batcher would form when it is busy); what the core would refuse, this
refuses the same way.

`apply(section)` brings the set up to date and returns what must finish before the snapshot is acknowledged
(the core stops a worker, or unloads a version, only after every frontend has acknowledged that it no
longer uses it): a dropped version drains (bounded) and closes; an instance whose worker is no longer named
has its batches there answered first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..core.validate import IOSpec, validate_request
from ..inference.types import InferRequest, InferResponse
from ..scheduler.factory import SchedulerSettings, make_scheduler
from .direct_instances import DirectInstance, DirectPeers
from .stats_relay import Recorder, StatsRelay

log = logging.getLogger("inferd.scaleout")

DRAIN_S = 30.0  # the longest a dropped version's queued and running requests are waited for here


class DirectModel:
    def __init__(self, serial: int, doc: dict[str, Any], peers: DirectPeers, pool: Any, relay: StatsRelay,
                 on_settled: Any) -> None:
        self.serial = serial
        self.name = str(doc["name"])
        self.version = str(doc["version"])
        config = doc["config"]
        self.io = IOSpec.from_config(config)
        self.stats = Recorder(serial, relay)
        depth = int(doc["depth"])
        if "dynamic_batching" in config:
            # up to a full batch of this frontend's requests may wait at the worker, each in the small batch the
            # rules sent it in: the worker merges what waits, so it must see all of it to form full batches
            depth = max(depth, int(config.get("max_batch_size") or 0))
        self.instances = {str(name): DirectInstance(peers, self.name, str(name), self.version, depth, pool,
                                                    self._changed, on_settled)
                          for name, *_ in doc["instances"]}
        self.scheduler = make_scheduler(self.name, config, list(self.instances.values()), self.stats,
                                        SchedulerSettings(max_queue_size=int(doc["max_queue"]), pipeline_depth=depth))
        self.scheduler.start()
        self.update(doc)

    def update(self, doc: dict[str, Any]) -> None:
        for name, identity, *why in doc["instances"]:
            inst = self.instances.get(str(name))
            if inst is not None:
                inst.name_worker(identity if isinstance(identity, str) else None, str(why[0]) if why else "")

    def _changed(self, inst: DirectInstance) -> None:
        self.scheduler.instance_changed(inst)

    @property
    def ready(self) -> bool:
        for inst in self.instances.values():  # noqa: SIM110 - a loop: no generator per request
            if inst.ready:
                return True
        return False

    @property
    def held(self) -> int:
        return sum(inst.held for inst in self.instances.values())

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        try:
            validate_request(self.io, request)
        except InferdError:
            self.stats.record_failure("OTHER", 0)
            raise
        return self.scheduler.submit(request)

    async def retire(self, timeout: float) -> None:
        """Take no more requests; answer (bounded) what is queued and running; then let go of the workers."""
        try:
            await self.scheduler.drain(timeout)
            await self.scheduler.close()
        finally:
            err = InferdError(ErrorCode.UNAVAILABLE, "model '%s' is unloaded" % self.name)
            for inst in self.instances.values():
                inst.close(err)


class DirectModels:
    def __init__(self, peers: DirectPeers, pool: Any, relay: StatsRelay) -> None:
        self.peers = peers
        self.relay = relay
        self._pool = pool
        self._models: dict[int, DirectModel] = {}
        self._settled = asyncio.Event()

    def get(self, serial: int) -> DirectModel | None:
        return self._models.get(serial)

    def apply(self, section: dict[str, Any]) -> list[Awaitable[None]]:
        wanted = {int(k): v for k, v in section.items()}
        waits: list[Awaitable[None]] = []
        for serial in [s for s in self._models if s not in wanted]:
            waits.append(self._models.pop(serial).retire(DRAIN_S))
        for serial, doc in wanted.items():
            model = self._models.get(serial)
            try:
                if model is None:
                    self._models[serial] = DirectModel(serial, doc, self.peers, self._pool, self.relay,
                                                       self._settled.set)
                else:
                    model.update(doc)
            except Exception:  # its requests keep going through the core
                log.exception("frontend process: cannot serve model '%s' directly", doc.get("name"))
        if any(model.held for model in self._models.values()):
            waits.append(self._until_settled(DRAIN_S))
        return waits

    def inflight(self) -> dict[str, Any]:
        """{"inflight": {serial: {instance: requests in flight}}, "pending": {serial: requests queued}} (the core
        adds them to its status view and metrics)."""
        inflight: dict[str, Any] = {}
        pending: dict[str, int] = {}
        for serial, model in self._models.items():
            counts = {name: inst.inflight for name, inst in model.instances.items() if inst.inflight}
            if counts:
                inflight[str(serial)] = counts
            queued = model.scheduler.pending_count
            if queued:
                pending[str(serial)] = queued
        return {"inflight": inflight, "pending": pending}

    async def _until_settled(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(model.held for model in self._models.values()):
            left = deadline - loop.time()
            if left <= 0:
                log.warning("frontend process: workers being replaced did not answer within %.0f s", timeout)
                return
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), left)
            except asyncio.TimeoutError:
                continue

    async def close(self) -> None:
        models, self._models = list(self._models.values()), {}
        await asyncio.gather(*(model.retire(0.0) for model in models), return_exceptions=True)
