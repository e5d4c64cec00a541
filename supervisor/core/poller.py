"""Poll mode (`--model-control-mode poll`): the repositories are scanned again every
`--repository-poll-secs`; a new model is loaded, a changed one reloaded, a removed one unloaded
(triton.md §4.4).

A model counts as changed when its fingerprint differs from the one seen at its last load attempt:
for a local directory every file's path, size and mtime (`layout.fingerprint`), for a cloud model
its objects' keys, sizes and ETags. So a model whose load failed is tried again only once its files
change, and a failed reload keeps the old versions serving (`ModelManager.load` does that). Scans
read the filesystem (or list the buckets) on a thread; loads run on the event loop, as explicit
loads do.
"""

from __future__ import annotations

import asyncio
import logging

from inferd.worker.wire.errors import InferdError

from ..repository.agents import PollFailed
from ..repository.sources import Repositories
from .models import ModelManager

log = logging.getLogger("inferd.poll")

MAX_CONCURRENT_LOADS = 4


async def scan_fingerprints(repositories: Repositories) -> dict[str, str]:
    """{model name: fingerprint} of the loadable models (a name in two repositories is left out:
    it cannot be loaded), read off the event loop. Raises InferdError when a repository cannot be read.
    A cloud model's fingerprint digests its objects' keys, sizes and ETags (repository/cloud/snapshot_cache.py)."""
    if repositories.cloud:
        return await repositories.fingerprints_async()
    return await asyncio.to_thread(repositories.fingerprints)


class RepositoryPoller:
    def __init__(self, manager: ModelManager, repositories: Repositories, interval_s: float,
                 seen: dict[str, str]) -> None:
        """`seen`: the fingerprints the start-up load saw (taken before it began)."""
        self.manager = manager
        self.repositories = repositories
        self.interval_s = interval_s
        self.seen = dict(seen)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except InferdError as exc:  # the repository cannot be read now: keep what is loaded
                log.error("polling the model repository failed: %s", exc.message)
            except Exception:
                log.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        current = await scan_fingerprints(self.repositories)
        for name in sorted(set(self.seen) - set(current)):
            del self.seen[name]
            await self._unload(name)
        changed = [name for name, mark in sorted(current.items()) if self.seen.get(name) != mark]
        self.seen.update((name, current[name]) for name in changed)
        limit = asyncio.Semaphore(MAX_CONCURRENT_LOADS)

        async def load(name: str) -> None:
            async with limit:
                try:
                    await self.manager.load(name)
                except InferdError as exc:
                    if not isinstance(exc, PollFailed):  # the manager logged it as Triton does
                        log.error("failed to load '%s': %s", name, exc.message)

        await asyncio.gather(*(load(name) for name in changed))

    async def _unload(self, name: str) -> None:
        entry = self.manager.entries.get(name)
        if entry is None or not entry.versions:
            return
        try:
            await self.manager.unload(name)
        except InferdError as exc:
            log.error("failed to unload '%s': %s", name, exc.message)
