"""The one renderer of the /metrics endpoint's body: the per-model families, the pinned memory pool, CPU and
RAM, the instances and shared memory, then the response cache's gauges, the GPUs' and last the Python models'
custom metrics.

Every /metrics there is calls `MetricsEndpoint.render` through `DataPlane.metrics_text()`: the metrics port
(http_api/metrics_server.py) and the OpenAI port's GET /metrics (openai_api/routes.py). Frontend processes
serve no /metrics: the metrics port stays in the core process, where the figures are.

What the statistics do not hold (pending queue lengths, instance states, shared memory, the pinned pool's size) is
read from the loaded versions at scrape time into an `ExtraMetrics` snapshot, once per scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .custom import CustomMetrics
from .gpu import GpuMetrics
from .model_families import model_families, model_tags
from .model_statistics import StatsRegistry
from .server_families import (
    INSTANCE_STATES,
    CacheMetrics,
    InstanceMetrics,
    instance_families,
    pinned_families,
    render_cache_metrics,
    system_families,
)
from .text_format import Family, encode


@dataclass(slots=True)
class ExtraMetrics:
    pending: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, version) -> queued
    instances: Sequence[InstanceMetrics] = ()
    shm_bytes_in_use: int | None = None  # supervisor-owned shared memory (pools + client regions)
    shm_bytes_reserved: int | None = None
    pinned_pool_bytes: int | None = None  # --pinned-memory-pool-byte-size: Triton's nv_pinned_memory_pool_*


ExtraFn = Callable[[], ExtraMetrics]


def render_metrics(stats: StatsRegistry, extra: ExtraFn | None = None, system: bool = True) -> bytes:
    """The families of the statistics and the scrape-time snapshot. extra: called once, returns pending counts,
    instances and shm use; system: with the nv_cpu_* gauges."""
    snapshot = extra() if extra is not None else ExtraMetrics()
    models = stats.all()
    families: list[Family] = []
    if models:
        families += model_families(models, snapshot.pending, stats.latency_config)
    if snapshot.pinned_pool_bytes is not None:
        families += pinned_families(snapshot.pinned_pool_bytes)
    if system:
        families += system_families()
    families += instance_families(snapshot.instances, snapshot.shm_bytes_in_use, snapshot.shm_bytes_reserved,
                                  {(s.name, s.version): model_tags(s) for s in models if s.metric_tags})
    return encode(families)


class LoadedVersions(Protocol):
    """What is read from the model manager (core.models.ModelManager): its loaded versions, each with `name`,
    `version`, `scheduler.pending_count` and `instances` (`name`, `state.value`, `restarts`, `restart_reasons`,
    `inflight`)."""

    def loaded_versions(self) -> Iterable[Any]: ...


class ResponseCacheFigures(Protocol):
    """What is read from the response cache (cache.ResponseCache)."""

    hits: int
    misses: int
    evictions: int
    lookup_ns: int
    insertion_ns: int

    def utilization(self) -> float: ...

    def __len__(self) -> int: ...


class MetricsEndpoint:
    """The /metrics body of this server. `runtime`: its `pool` (in_use_bytes, total_bytes) is read at each
    scrape; `cpu_metrics`: with the nv_cpu_* gauges (--allow-cpu-metrics); `pinned_pool_bytes`: the total of
    Triton's nv_pinned_memory_pool_* gauges (--pinned-memory-pool-byte-size); `cache`, `gpu`, `custom`: the
    response cache, the NVML poller and the custom metrics, each left out when None."""

    def __init__(self, registry: StatsRegistry, manager: LoadedVersions, runtime: Any, *, cpu_metrics: bool = True,
                 pinned_pool_bytes: int | None = None, cache: ResponseCacheFigures | None = None,
                 gpu: GpuMetrics | None = None, custom: CustomMetrics | None = None) -> None:
        self.registry = registry
        self.manager = manager
        self.runtime = runtime
        self.cpu_metrics = cpu_metrics
        self.pinned_pool_bytes = pinned_pool_bytes
        self.cache = cache
        self.gpu = gpu
        self.custom = custom
        # with frontend processes on the direct path: their requests queued per version (by serial) and in flight
        # per instance (serial, instance name), as last pulled (frontend_processes/publisher.Publisher)
        self.direct_pending: Callable[[int], int] | None = None
        self.direct_inflight: Callable[[int, str], int] | None = None

    def render(self) -> bytes:
        body = render_metrics(self.registry, extra=self.extra, system=self.cpu_metrics)
        cache = self.cache
        if cache is not None:
            body += render_cache_metrics(CacheMetrics(cache.utilization(), len(cache), cache.hits, cache.misses,
                                                      cache.evictions, cache.lookup_ns, cache.insertion_ns))
        if self.gpu is not None:  # the nv_gpu_* families of the last NVML poll
            body += self.gpu.render()
        if self.custom is not None:  # the families Python models made (pb_utils.MetricFamily)
            body += self.custom.render()
        return body

    def extra(self) -> ExtraMetrics:
        """The scrape-time snapshot of what the statistics do not hold."""
        pending: dict[tuple[str, str], int] = {}
        instances: list[InstanceMetrics] = []
        more_pending, more_inflight = self.direct_pending, self.direct_inflight
        for mv in self.manager.loaded_versions():
            pending[(mv.name, str(mv.version))] = mv.scheduler.pending_count + (
                more_pending(mv.serial) if more_pending is not None else 0)
            for inst in mv.instances:
                state = inst.state.value
                inflight = inst.inflight + (more_inflight(mv.serial, inst.name) if more_inflight is not None else 0)
                instances.append(InstanceMetrics(
                    mv.name, str(mv.version), inst.name, state if state in INSTANCE_STATES else "starting",
                    restarts=inst.restarts, restart_reasons=dict(inst.restart_reasons), inflight=inflight))
        pool = self.runtime.pool
        return ExtraMetrics(pending=pending, instances=instances, shm_bytes_in_use=pool.in_use_bytes,
                            shm_bytes_reserved=pool.total_bytes, pinned_pool_bytes=self.pinned_pool_bytes)
