"""All model repositories of a server, local directories and cloud URLs alike.

Local repositories are read by `layout` directly. A cloud repository (cloud/) is listed through its
store and each model is copied into a local snapshot before it is read, so everything above this
module sees local model directories only. The cloud package is imported only when a cloud URL is
named; its calls block on the network, so the async entry points run them on a small bounded
executor, and the names seen by the last listing answer the synchronous `list_models` (the
repository index) without touching the network.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferd.worker.wire.errors import InferdError, not_found

from . import layout

if TYPE_CHECKING:
    from .cloud.snapshot_cache import CloudRepository

log = logging.getLogger("inferd.repository")

CLOUD_THREADS = 4  # concurrent cloud listings/downloads (one model's objects download one after another)


@dataclass(frozen=True)
class CloudSettings:
    credentials: Any  # cloud.credentials.CloudCredentials
    cache_dir: str
    timeout_s: float = 60.0


class Repositories:
    def __init__(self, roots: Sequence[str], cloud: CloudSettings | None = None, namespacing: bool = False) -> None:
        self.roots = tuple(roots)
        # --model-namespacing: a name in several repositories is several models (core/namespaces.py); the
        # fingerprints are then keyed "<repository>::<name>"
        self.namespacing = namespacing
        self.cloud: dict[str, CloudRepository] = {}
        self._executor: ThreadPoolExecutor | None = None
        urls = [r for r in self.roots if _is_url(r)]
        if urls:
            from .cloud.credentials import CloudCredentials
            from .cloud.location import parse_url
            from .cloud.snapshot_cache import CloudRepository

            settings = cloud or CloudSettings(CloudCredentials(), os.path.expanduser("~/.cache/inferd/models"))
            for url in urls:
                self.cloud[url] = CloudRepository(parse_url(url), settings.credentials, settings.cache_dir,
                                                  settings.timeout_s)
            self._executor = ThreadPoolExecutor(CLOUD_THREADS, thread_name_prefix="inferd-cloud")
        self.local = tuple(r for r in self.roots if not _is_url(r))

    def close(self) -> None:
        """At shutdown: copies under way stop at their next object; queued work is dropped."""
        for repo in self.cloud.values():
            repo.closing.set()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ---- listing ----
    def list_models(self) -> layout.RepositoryScan:
        """Every model name: local directories now, cloud names as of the last listing."""
        scan = layout.list_models(self.local)
        if not self.cloud:
            return scan
        where: dict[str, list[str]] = {n: [r] for n, r in scan.models.items()}
        for n, rs in scan.duplicates.items():
            where[n] = list(rs)
        for url, repo in self.cloud.items():
            for name in list(repo.names):
                try:
                    layout.validate_model_name(name)
                except InferdError as e:
                    scan.invalid[name] = e.message
                    continue
                where.setdefault(name, []).append(url)
        merged = layout.RepositoryScan(invalid=scan.invalid)
        for name, roots in where.items():
            if len(roots) == 1:
                merged.models[name] = roots[0]
            else:
                merged.duplicates[name] = tuple(roots)
        return merged

    def refresh(self) -> None:
        """List every cloud repository again (blocking). InferdError when one cannot be read."""
        errors = []
        for repo in self.cloud.values():
            try:
                repo.refresh()
            except InferdError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    async def refresh_async(self) -> None:
        await self._run(self.refresh)

    def fingerprints(self) -> dict[str, str]:
        """{model name: fingerprint} of the loadable models (blocking: lists the cloud repositories).

        A cloud repository that cannot be listed now keeps the names and fingerprints of its last
        listing (its models stay as they are) and the others are still followed."""
        for cloud in self.cloud.values():
            try:
                cloud.refresh()
            except InferdError as e:
                log.error("polling the model repository failed: %s", e.message)
        scan = self.list_models()
        out = {}
        placed = [(name, root) for name, root in scan.models.items()]
        if self.namespacing:
            placed += [(name, root) for name, roots in scan.duplicates.items() for root in roots]
        for name, root in placed:
            repo = self.cloud.get(root)
            mark = repo.names[name] if repo is not None else layout.fingerprint(os.path.join(root, name))
            out[f"{root}::{name}" if self.namespacing else name] = mark
        return out

    async def fingerprints_async(self) -> dict[str, str]:
        return await self._run(self.fingerprints)  # type: ignore[no-any-return]

    # ---- one model ----
    def find_model(self, name: str, model_config_name: str = "", root: str = "") -> layout.ModelSource:
        """Locate model `name` and read it; a cloud model is copied to its local snapshot first. `root`: read
        it from that repository only (--model-namespacing)."""
        layout.validate_model_name(name)
        if root:
            repo = self.cloud.get(root)
            if repo is None:
                return layout.read_model(root, name, model_config_name)
            objects = repo.model_objects(name)
            if not objects:
                raise not_found(f"failed to load '{name}', failed to poll from model repository: model not found")
            return layout.read_model(repo.materialize(name, objects), name, model_config_name)
        if not self.cloud:
            return layout.find_model(self.local, name, model_config_name)
        local = [os.path.abspath(r) for r in self.local if os.path.isdir(os.path.join(r, name))]
        remote = []
        failures: list[InferdError] = []
        for url, repo in self.cloud.items():
            try:
                objects = repo.model_objects(name)
            except InferdError as e:  # an unreadable repository fails only the models not found elsewhere
                failures.append(e)
                continue
            if objects:
                remote.append((url, repo, objects))
        found = local + [url for url, _, _ in remote]
        if not found and failures:
            raise failures[0]
        if not found:
            raise not_found(f"failed to load '{name}', failed to poll from model repository: model not found")
        for failure in failures:
            log.warning("loading '%s' from %s although %s", name, found[0], failure.message)
        if len(found) > 1:
            raise layout.duplicate_error(name, found)
        if local:
            return layout.read_model(local[0], name, model_config_name)
        _, repo, objects = remote[0]
        return layout.read_model(repo.materialize(name, objects), name, model_config_name)

    async def find_model_async(self, name: str, model_config_name: str = "", root: str = "") -> layout.ModelSource:
        if not self.cloud:
            return self.find_model(name, model_config_name, root)
        return await self._run(self.find_model, name, model_config_name, root)  # type: ignore[no-any-return]


def _is_url(root: str) -> bool:
    return "://" in root
