"""The registry of loaded models: one ModelVersion per served (model, version), with its instances,
scheduler and state. Requests are resolved and routed by the data plane (core/dataplane_impl.py), not here.

The ModelManager owns load, reload and unload. A load builds the new versions completely (config,
auto-complete, workers started and ready) before swapping them in, so the old ones keep serving
until then; unload drains in-flight requests (bounded) before stopping workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..ensemble.graph import EnsemblePlan, build_plan, check_composing
from ..ensemble.scheduler import EnsembleScheduler
from ..inference.types import InferRequest, InferResponse
from ..metrics.latency_histogram import bucket_overrides
from ..repository import python_backends
from ..repository.agents import PollFailed
from ..response_cache import model_wants_cache
from ..scheduler.base import Scheduler
from ..scheduler.factory import SchedulerSettings, make_scheduler
from ..scheduler.rate_gate import RateGate
from . import loader, namespaces, overrides, warmup
from .load_settings import LoaderSettings
from .validate import IOSpec

log = logging.getLogger("inferd.models")
_cache_generations = itertools.count(1)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"


_serials = itertools.count(1)


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    config: dict[str, Any]  # normalised config, Triton JSON rendering
    config_json: str
    io: IOSpec
    instances: list[Any]
    scheduler: Scheduler
    stats: Any
    decoupled: bool = False
    metadata_base: dict[str, Any] = field(default_factory=dict)  # metadata without "versions"
    state: str = LOADING
    reason: str = ""
    load_seconds: float = 0.0
    ensemble: EnsemblePlan | None = None  # set for ensembles, which have no instances of their own
    cache_generation: int = 0  # > 0: responses are cached, keyed with this number (unique per load)
    labels: dict[str, tuple[bytes, ...]] = field(default_factory=dict)  # classification labels per output
    rate_gate: RateGate | None = None  # its instances that the rate limiter limits (unregistered on stop)
    serial: int = field(default_factory=lambda: next(_serials))  # unique per load (frontends key direct versions)

    @property
    def ready(self) -> bool:
        return self.state == READY and (self.ensemble is not None or any(i.ready for i in self.instances))

    @functools.cached_property
    def device_inputs(self) -> bool:
        """Whether inputs in a client's CUDA region may reach this model's workers on the device: a model
        with GPU instances whose backend takes device inputs (Python with FORCE_CPU_ONLY_INPUT_TENSORS
        "no", PyTorch, TensorRT) and whose inputs the supervisor never reads (no ensemble, sequence state
        or cache). Others get a host copy made here, so their workers need no CUDA library for it."""
        cfg = self.config
        backend = cfg.get("backend") or ""
        if python_backends.runs_python(cfg):
            entry = (cfg.get("parameters") or {}).get("FORCE_CPU_ONLY_INPUT_TENSORS") or {}
            takes = str(entry.get("string_value", "") if isinstance(entry, dict) else entry).strip().lower() == "no"
        else:
            takes = backend in ("pytorch", "tensorrt")
        return (takes and self.ensemble is None and not self.cache_generation and "sequence_batching" not in cfg
                and any(g.get("kind") == "KIND_GPU" for g in cfg.get("instance_group") or ()))

    @functools.cached_property
    def host_only_inputs(self) -> frozenset[str]:
        """Inputs the scheduler reads (shape tensors): always copied to the host."""
        return frozenset(i.get("name", "") for i in self.config.get("input") or () if i.get("is_shape_tensor"))


@dataclass(eq=False)
class ModelEntry:
    """Everything the index says about one model name."""

    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    # (version or None, state, reason) for versions that failed or were unloaded
    records: dict[int | None, tuple[str, str]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loaded_once: bool = False
    override_root: str | None = None  # the `file:` parameters' directory the loaded versions run from
    namespace: str = ""  # its repository, with --model-namespacing (namespaces.py): entries key it "<ns>::<name>"


class StepRouter(Protocol):
    """Where an ensemble sends its steps: the data plane, as any request."""

    async def call_step(self, request: InferRequest) -> InferResponse: ...

    def stream_step(self, request: InferRequest) -> AsyncIterator[InferResponse]: ...


class ModelManager:
    """The registry of loaded model versions and their state: loads, reloads and unloads them; the data
    plane resolves requests against it."""

    def __init__(self, settings: LoaderSettings, stats_registry: Any, response_cache: bool = False) -> None:
        self.settings = settings
        self.response_cache = response_cache  # the server has a response cache (--cache-config)
        self.stats_registry = stats_registry
        self.entries: dict[str, ModelEntry] = {}
        # the data plane, which resolves and routes every request (core/dataplane_impl.py), and the frontend
        # processes' publisher (frontend_processes/) watch every change; the data plane says where ensemble steps go
        self._watchers: list[Callable[[], None]] = []
        self.steps: StepRouter | None = None
        # --model-load-thread-count: how many models' workers start at once (ensembles have none to start)
        self._load_slots = asyncio.Semaphore(max(1, settings.load_threads))
        # --model-namespacing: entries are keyed "<repository>::<name>" (namespaces.py)
        self.namespacing = bool(getattr(settings.repos, "namespacing", False))

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` on every change, in the order watchers were added."""
        self._watchers.append(callback)

    def changed(self, *_: Any) -> None:
        """The version set or a readiness changed (an instance's state, a load, an unload): the data plane
        forgets the versions it resolved, the frontend processes get the new state."""
        for callback in self._watchers:
            callback()

    # ---- queries ----
    def entry(self, name: str) -> ModelEntry:
        e = self.entries.get(name)
        if e is None:
            namespace, plain = namespaces.split(name)
            e = self.entries[name] = ModelEntry(plain, namespace=namespace)
        return e

    def lookup(self, name: str) -> ModelEntry | None:
        """The entry a client's model name (or an ensemble step's) names; with --model-namespacing a plain
        name of several models is refused as Triton refuses it (namespaces.pick)."""
        if not self.namespacing:
            return self.entries.get(name)
        return namespaces.pick(self.entries, name)

    def _keys(self, name: str) -> list[str]:
        """With --model-namespacing, the registry keys a plain `name` stands for (one per repository holding
        it, and those of the registry); else just `name`."""
        if not self.namespacing or namespaces.SEP in name:
            return [name]
        known = [k for k in self.entries if namespaces.split(k)[1] == name]
        keys = sorted(set(namespaces.keys_in(self.settings.repos.list_models(), name)) | set(known))
        return keys or [name]

    def loaded_versions(self) -> list[ModelVersion]:
        return [mv for e in self.entries.values() for mv in e.versions.values()]

    def all_ready(self) -> bool:
        """Strict readiness, as Triton 2.51: every loaded version is ready and no model of the index
        failed to load (a failure stays until the model loads, even after an unload or after it left
        the repository in poll mode); a version that was unloaded does not count."""
        if not all(mv.ready for mv in self.loaded_versions()):
            return False
        return not any(state != READY and reason != "unloaded"
                       for e in self.entries.values() for rv, (state, reason) in e.records.items()
                       if rv is None or rv not in e.versions)

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        if self.namespacing:  # every repository's model of a name is a row of that name (as Triton lists them)
            listed = set(namespaces.all_keys(self.settings.repos.list_models()))
            keys = sorted(listed | set(self.entries), key=lambda k: namespaces.split(k)[::-1])
        else:
            keys = sorted(set(loader.list_model_names(self.settings)) | set(self.entries))
        out: list[dict[str, Any]] = []
        for key in keys:
            name = namespaces.split(key)[1]
            e = self.entries.get(key)
            rows: list[dict[str, Any]] = []
            if e is not None:
                for v, mv in sorted(e.versions.items()):
                    state = mv.state if mv.state != READY or mv.ready else UNAVAILABLE
                    reason = mv.reason if state != READY else ""
                    if state == UNAVAILABLE and not reason:
                        reason = _unready_reason(mv)
                    rows.append(_row(name, str(v), state, reason))
                for rv, (state, reason) in sorted(e.records.items(), key=lambda kv: kv[0] or 0):
                    if rv is None or rv not in e.versions:
                        rows.append(_row(name, "" if rv is None else str(rv), state, reason))
            if not rows:
                rows.append({"name": name})
            out.extend(r for r in rows if not ready_only or r.get("state") == READY)
        return out

    # ---- control ----
    async def load(self, name: str, config_override: str | None = None,
                   files: dict[str, bytes] | None = None, chain: tuple[str, ...] = ()) -> None:
        """Load (or reload) every version of `name`. `chain`: the ensembles whose load asked for it. With
        --model-namespacing a plain name loads the model of that name in every repository holding it."""
        keys = self._keys(name)
        if keys != [name]:
            failures = []
            for key in keys:
                try:
                    await self.load(key, config_override, files, chain)
                except InferdError as exc:
                    failures.append(exc)
            if failures:
                raise failures[0]
            return
        namespace, plain = namespaces.split(name)
        loader.check_model_name(plain)
        e = self.entry(name)
        self.changed()
        async with e.lock:
            started = time.monotonic()
            plan: loader.LoadPlan | None = None
            try:
                plan = await loader.plan_load(self.settings, plain, config_override, files, root=namespace)
                plan.namespace = namespace
                ensemble = await self._prepare_ensemble(plan, chain) if plan.is_ensemble else None
            except BaseException as exc:
                loader.discard_override(plan)  # a failed ensemble check; plan_load cleans up after itself
                if not isinstance(exc, InferdError):
                    raise
                if isinstance(exc, PollFailed):  # as Triton: the model keeps its state (and readiness)
                    log.error("Poll failed for model directory '%s': %s", plain, exc.detail, extra={"model": plain})
                    if not e.versions and not e.records:
                        self.entries.pop(name, None)
                elif exc.code == ErrorCode.NOT_FOUND and not e.versions:
                    self.entries.pop(name, None)  # nothing on disk: no index entry, as Triton
                else:
                    e.records = {None: (UNAVAILABLE, exc.message)}
                raise
            try:
                await self._replace_versions(e, plan, ensemble, started)
            finally:
                if e.override_root != plan.override_root:  # not adopted: the load failed
                    loader.discard_override(plan)

    async def _replace_versions(self, e: ModelEntry, plan: loader.LoadPlan, ensemble: Any, started: float) -> None:
        """Start the plan's versions; once all are ready, swap them in and stop the old ones (and remove the
        directory of the old ones' `file:` parameters, which no worker uses any more)."""
        name = plan.name
        if ensemble is not None:
            new_versions, failed = await self._start_versions(plan, ensemble)
        else:
            async with self._load_slots:
                new_versions, failed = await self._start_versions(plan, ensemble)
        e.records.update((v, (UNAVAILABLE, message)) for v, message in failed.items())
        errors = list(failed.values())
        if errors:
            for mv in new_versions.values():
                await self._stop_version(mv, drain_timeout=0)
            # a failed reload keeps the old versions serving
            raise InferdError(ErrorCode.INVALID_ARG,
                              "failed to load '%s': %s" % (name, "; ".join(errors)))
        namespace = e.namespace
        old, old_root = e.versions, e.override_root
        e.versions, e.override_root = new_versions, plan.override_root
        self.changed()
        e.records = {}
        e.loaded_once = True
        elapsed = time.monotonic() - started
        for mv in new_versions.values():
            mv.load_seconds = elapsed
        try:
            for v, mv in old.items():
                await self._stop_version(mv, drain_timeout=self.settings.unload_drain_s)
                if v not in new_versions:
                    self.stats_registry.remove(name, str(v), namespace)
        finally:
            if old_root != e.override_root:
                overrides.discard(old_root)
        log.info("successfully loaded '%s' version(s) %s in %.2fs", name,
                 ",".join(str(v) for v in sorted(new_versions)), elapsed, extra={"model": name})

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload every version; with unload_dependents an ensemble's composing models go too (those no
        other loaded ensemble uses). With --model-namespacing a plain name unloads the model of that name in
        every repository."""
        keys = self._keys(name)
        if keys != [name]:
            for key in keys:
                await self.unload(key, unload_dependents)
            return
        key, name = name, namespaces.split(name)[1]
        loader.check_model_name(name)
        e = self.entries.get(key)
        if e is None:
            if name in loader.list_model_names(self.settings):
                return  # never loaded: nothing to do, as Triton
            raise InferdError(ErrorCode.INVALID_ARG, "failed to unload '%s', no version is available" % name)
        async with e.lock:
            versions = e.versions
            for mv in versions.values():
                mv.state = UNLOADING
            self.changed()
            for v, mv in versions.items():
                await self._stop_version(mv, drain_timeout=self.settings.unload_drain_s)
                self.stats_registry.remove(name, str(v), e.namespace)
                e.records[v] = (UNAVAILABLE, "unloaded")
            e.versions = {}
            overrides.discard(e.override_root)  # its workers have stopped
            e.override_root = None
            self.changed()
            if not versions and not e.records:  # a failed load keeps its reason, as Triton
                e.records = {None: (UNAVAILABLE, "unloaded")}
            loader.release_env(self.settings, name)
            log.info("successfully unloaded '%s'", name, extra={"model": name})
        if unload_dependents:
            composing = {c for mv in versions.values() if mv.ensemble is not None
                         for c in mv.ensemble.composing_models}
            still_used = {c for mv in self.loaded_versions() if mv.ensemble is not None
                          for c in mv.ensemble.composing_models}
            for dep in sorted(composing - still_used):
                if dep != key and self.entries.get(dep) is not None and self.entries[dep].versions:
                    await self.unload(dep, unload_dependents=True)

    async def shutdown(self, drain_timeout: float) -> None:
        versions = self.loaded_versions()
        for mv in versions:
            mv.state = UNLOADING
        self.changed()
        await asyncio.gather(*(self._stop_version(mv, drain_timeout) for mv in versions),
                             return_exceptions=True)

    # ---- ensembles ----
    async def _prepare_ensemble(self, plan: loader.LoadPlan, chain: tuple[str, ...]) -> EnsemblePlan:
        """Check the step graph, load the composing models that are not loaded yet, check they fit."""
        graph = build_plan(plan.config)
        if self.namespacing:  # each step names its model in the ensemble's own repository (namespaces.py)
            graph = dataclasses.replace(graph, steps=tuple(
                dataclasses.replace(s, model_name=namespaces.key(plan.namespace, s.model_name)) for s in graph.steps))
        chain = chain + (namespaces.key(plan.namespace, plan.name) if self.namespacing else plan.name,)
        for dep in graph.composing_models:
            dep = self._composing_key(dep)
            if dep in chain:
                raise InferdError(ErrorCode.INVALID_ARG, "circular dependency between ensembles: %s"
                                  % " -> ".join(chain + (dep,)))
            await self._ensure_loaded(dep, chain)
        check_composing(graph, plan.config, self._composing_config)
        decoupled = frozenset(s.index for s in graph.steps
                              if (mv := self._composing_version(s.model_name, s.model_version)) is not None
                              and mv.decoupled)
        return dataclasses.replace(graph, decoupled_steps=decoupled)

    async def load_once(self, name: str, chain: tuple[str, ...] = ()) -> None:
        """Load `name` unless it is loaded already (start-up: an ensemble may have loaded it first)."""
        keys = self._keys(name)
        if keys != [name]:
            await asyncio.gather(*(self.load_once(key, chain) for key in keys))
            return
        e = self.entries.get(name)
        if e is not None and e.lock.locked():  # being loaded right now: wait for that load
            async with e.lock:
                pass
        e = self.entries.get(name)
        if e is not None and e.versions:
            return
        await self.load(name, chain=chain)

    async def _ensure_loaded(self, name: str, chain: tuple[str, ...]) -> None:
        try:
            await self.load_once(name, chain)
        except InferdError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                return  # reported by check_composing as a model that is not available
            raise InferdError(ErrorCode.INVALID_ARG, "failed to load composing model '%s': %s"
                              % (name, exc.message)) from None

    def _composing_key(self, step_model: str) -> str:
        """Which model a step's load loads: with --model-namespacing the one in the ensemble's repository, else
        the one model of that name elsewhere (several: Triton's ambiguity error)."""
        if not self.namespacing:
            return step_model
        namespace, name = namespaces.split(step_model)
        keys = namespaces.keys_in(self.settings.repos.list_models(), name)
        if step_model in keys or not keys:
            return step_model
        if len(keys) > 1:
            raise namespaces.ambiguous(name, len(keys))
        return keys[0]

    def _composing_version(self, name: str, version: int) -> ModelVersion | None:
        e = self.lookup(name)
        if e is None or not e.versions:
            return None
        return e.versions.get(version) if version >= 0 else e.versions[max(e.versions)]

    def _composing_config(self, name: str, version: int) -> dict[str, Any] | None:
        mv = self._composing_version(name, version)
        return mv.config if mv is not None else None

    # ---- internals ----
    async def _start_versions(self, plan: loader.LoadPlan, ensemble: Any) -> tuple[dict[int, ModelVersion],
                                                                                   dict[int, str]]:
        """({version: started}, {version: why it failed}); a failed load is tried again, every version,
        up to --model-load-retry-count times."""
        started, failed = await self._start_each_version(plan, ensemble)
        retries = self.settings.load_retries
        for attempt in range(1, retries + 1):
            if not failed:
                break
            for mv in started.values():
                await self._stop_version(mv, drain_timeout=0)
            log.warning("loading '%s' failed (%s): trying again (%d of %d)", plan.name, "; ".join(failed.values()),
                        attempt, retries)
            started, failed = await self._start_each_version(plan, ensemble)
        return started, failed

    async def _start_each_version(self, plan: loader.LoadPlan, ensemble: Any) -> tuple[dict[int, ModelVersion],
                                                                                       dict[int, str]]:
        results = await asyncio.gather(*(self._start_version(plan, v, ensemble) for v in plan.versions),
                                       return_exceptions=True)
        started: dict[int, ModelVersion] = {}
        failed: dict[int, str] = {}
        for v, res in zip(plan.versions, results):
            if isinstance(res, ModelVersion):
                started[v] = res
            else:
                failed[v] = str(res.message if isinstance(res, InferdError) else res)
        return started, failed

    async def _start_version(self, plan: loader.LoadPlan, version: int,
                             ensemble: EnsemblePlan | None = None) -> ModelVersion:
        config = plan.config
        stats = self.stats_registry.get(plan.name, str(version), plan.namespace)
        stats.metric_tags = tuple(sorted((config.get("metric_tags") or {}).items()))  # labels "_<key>"
        # model_metrics' histogram buckets (raises for unusable ones, which Triton's prometheus-cpp throws on)
        buckets = bucket_overrides(config, plan.name) if self.stats_registry.latency_config.histograms else None
        if ensemble is not None:
            if self.steps is None:
                raise InferdError(ErrorCode.INTERNAL, "ensemble '%s' loaded without a data plane" % plan.name)
            mv = ModelVersion(plan.name, version, config, plan.config_json, IOSpec.from_config(config), [],
                              EnsembleScheduler(ensemble, str(version), self.steps.call_step,
                                                self.steps.stream_step, stats,
                                                batched=int(config.get("max_batch_size") or 0) > 0),
                              stats, decoupled=ensemble.decoupled, metadata_base=plan.metadata_base,
                              ensemble=ensemble, labels=plan.labels)
            self.stats_registry.configure(stats, decoupled=mv.decoupled, cache_enabled=False, buckets=buckets)
            mv.state = READY
            return mv
        load_started = time.monotonic()  # nv_model_load_duration_secs: until its instances are up, as Triton
        warmer = await warmup.build_warmer(config, plan.source.path, plan.name, str(version), stats)
        instances = loader.make_instances(self.settings, plan, version)
        io = IOSpec.from_config(config)
        scheduled = [inst for inst in instances if not inst.passive]
        gate = self._rate_gate(plan.name, version, scheduled)  # raises: the resources cannot be had
        scheduler = make_scheduler(plan.name, config, scheduled, stats, SchedulerSettings(
            max_queue_size=self.settings.max_queue_size, pipeline_depth=self.settings.timings.pipeline_depth),
            gate=gate)
        mv = ModelVersion(plan.name, version, config, plan.config_json, io, instances, scheduler, stats,
                          decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled")),
                          metadata_base=plan.metadata_base, labels=plan.labels, rate_gate=gate)
        if self.response_cache and model_wants_cache(config):
            mv.cache_generation = next(_cache_generations)
        # as Triton: the per-model nv_cache_* counters follow the model's config, even without a server cache
        self.stats_registry.configure(stats, decoupled=mv.decoupled, buckets=buckets,
                                      cache_enabled=bool((config.get("response_cache") or {}).get("enable")))
        def on_change(inst: Any) -> None:
            self.changed()
            scheduler.instance_changed(inst)

        for inst in instances:
            inst.on_change = on_change
            inst.warmup = warmer  # every start of its worker (restarts too) runs model_warmup first
        try:
            await asyncio.gather(*(inst.start() for inst in instances))
        except BaseException:
            await asyncio.gather(*(inst.stop() for inst in instances), return_exceptions=True)
            self._unregister(mv)
            raise
        stats.load_duration_s = time.monotonic() - load_started
        scheduler.start()
        mv.state = READY
        self.changed()
        return mv

    def _rate_gate(self, name: str, version: int, instances: list[Any]) -> RateGate | None:
        """With --rate-limit=execution_count, the instances whose group has a rate_limiter, registered with
        the server's rate limiter (InferdError when it cannot give them their resources)."""
        limiter = self.settings.runtime.rate_limiter
        limited = [inst for inst in instances if inst.rate_limiter is not None]
        if limiter is None or not limited:
            return None
        tickets = limiter.register(f"{name} version {version}",
                                   [(inst.name, inst.load.device_id, inst.rate_limiter) for inst in limited])
        return RateGate(limiter, list(zip(limited, tickets)))

    @staticmethod
    def _unregister(mv: ModelVersion) -> None:
        if mv.rate_gate is not None:
            mv.rate_gate.limiter.unregister(mv.rate_gate.tickets)

    async def _stop_version(self, mv: ModelVersion, drain_timeout: float) -> None:
        if drain_timeout > 0:
            await mv.scheduler.drain(drain_timeout)
        await mv.scheduler.close()
        await asyncio.gather(*(inst.stop() for inst in mv.instances), return_exceptions=True)
        self._unregister(mv)
        mv.state = UNAVAILABLE
        mv.reason = "unloaded"
        self.changed()


def _unready_reason(mv: ModelVersion) -> str:
    """'no ready instance', with why each instance is not ready (its worker's last end: memory cap, crash)."""
    why = [f"instance '{i.name}' is {i.state.value}: {i.last_error.message}" for i in mv.instances
           if not i.ready and getattr(i, "last_error", None) is not None]
    return "; ".join(["no ready instance", *why])


def _row(name: str, version: str, state: str, reason: str) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name}
    if version:
        row["version"] = version
    row["state"] = state
    if reason:
        row["reason"] = reason
    return row
