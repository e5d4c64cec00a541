"""Server-wide families, read at scrape time: the model instances (worker processes: state, restarts, requests
in flight), the supervisor's shared memory, Triton's pinned memory pool gauges, the host's CPU and RAM
(nv_cpu_*), and the response cache as a whole (Triton's nv_cache_* gauges).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from .text_format import Family, encode, escape

INSTANCE_STATES = ("starting", "ready", "draining", "stopped", "failed")
# why a worker was replaced (instances/worker.py EXIT_REASONS): one inferd_instance_restarts_total series each
RESTART_REASONS = ("exit", "signal", "hung", "memory", "recycled")


@dataclass(slots=True)
class InstanceMetrics:
    """One model instance (worker process) as the instance manager sees it at scrape time."""

    model: str
    version: str
    instance: str  # e.g. "simple_0"
    state: str  # one of INSTANCE_STATES
    restarts: int = 0  # restarts since the version loaded
    restart_reasons: Mapping[str, int] = field(default_factory=dict)  # the same by reason (RESTART_REASONS)
    inflight: int = 0  # requests sent to the worker and not yet answered


class _CpuSampler:
    """CPU utilisation between two scrapes (psutil keeps the previous reading), 0..1."""

    __slots__ = ("_primed",)

    def __init__(self) -> None:
        self._primed = False

    def utilization(self) -> float:
        if not self._primed:
            psutil.cpu_percent(interval=None)  # the first reading has no interval behind it
            self._primed = True
            return 0.0
        return psutil.cpu_percent(interval=None) / 100.0


_cpu = _CpuSampler()


def pinned_families(total: int) -> list[Family]:
    """Triton's pinned memory pool gauges. Without a GPU Triton allocates no pool and still reports the
    --pinned-memory-pool-byte-size it was given as the total, and 0 used; inferd has no pinned pool and
    reports the same."""
    fam_total = Family("nv_pinned_memory_pool_total_bytes", "gauge", "Pinned memory pool total memory size, in bytes")
    fam_total.add_plain(total)
    fam_used = Family("nv_pinned_memory_pool_used_bytes", "gauge", "Pinned memory pool used memory size, in bytes")
    fam_used.add_plain(0)
    return [fam_total, fam_used]


def system_families() -> list[Family]:
    """The host's CPU utilisation since the last scrape and its RAM (--allow-cpu-metrics)."""
    mem = psutil.virtual_memory()
    fam_util = Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
    fam_util.add_plain(_cpu.utilization())
    fam_total = Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
    fam_total.add_plain(int(mem.total))
    fam_used = Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
    fam_used.add_plain(int(mem.total - mem.available))
    return [fam_util, fam_total, fam_used]


def instance_families(instances: Sequence[InstanceMetrics], shm_bytes_in_use: int | None,
                      shm_bytes_reserved: int | None, tags: Mapping[tuple[str, str], str]) -> list[Family]:
    """The worker processes' states, restarts and requests in flight, then the supervisor's shared memory;
    `tags`: (model, version) -> its labels from model_families.model_tags."""
    families: list[Family] = []
    instances = sorted(instances, key=lambda i: (i.model, i.version, i.instance))
    if instances:
        restarts = Family("inferd_instance_restarts_total", "counter",
                          "Worker process restarts per model instance since the version loaded, by why the "
                          "worker before ended (exit, signal, hung, memory, recycled)")
        state = Family("inferd_instance_state", "gauge",
                       "Model instance state: 1 for the current state, 0 for the others")
        inflight = Family("inferd_instance_inflight_requests", "gauge",
                          "Requests sent to the model instance and not yet answered")
        for inst in instances:
            head = (f'{tags.get((inst.model, inst.version), "")}instance="{escape(inst.instance)}",'
                    f'model="{escape(inst.model)}"')
            version = f'version="{escape(inst.version)}"'
            reasons = inst.restart_reasons
            for why in RESTART_REASONS if not reasons or set(reasons) <= set(RESTART_REASONS) else sorted(reasons):
                restarts.add(f'{head},reason="{escape(why)}",{version}', reasons.get(why, 0))
            inflight.add(f"{head},{version}", inst.inflight)
            known = inst.state in INSTANCE_STATES
            for st in INSTANCE_STATES if known else (*INSTANCE_STATES, inst.state):
                state.add(f'{head},state="{escape(st)}",{version}', 1 if st == inst.state else 0)
        families += [restarts, state, inflight]
    if shm_bytes_in_use is not None:
        fam = Family("inferd_shm_bytes_in_use", "gauge", "Shared memory bytes in use for tensors")
        fam.add_plain(shm_bytes_in_use)
        families.append(fam)
    if shm_bytes_reserved is not None:
        fam = Family("inferd_shm_bytes_reserved", "gauge", "Shared memory bytes reserved by the pools")
        fam.add_plain(shm_bytes_reserved)
        families.append(fam)
    return families


@dataclass(slots=True)
class CacheMetrics:
    """The response cache as a whole (Triton's server-wide nv_cache_* gauges)."""

    utilization: float  # bytes used / capacity, 0..1
    entries: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int  # hits and misses
    insertion_ns: int


def render_cache_metrics(cache: CacheMetrics) -> bytes:
    """The server-wide response cache gauges, appended to the /metrics body when a cache is configured."""
    rows = (
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", float(cache.utilization)),
        ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entries),
        ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
        ("nv_cache_num_lookups", "Number of cache lookups in response cache", cache.hits + cache.misses),
        ("nv_cache_num_evictions", "Number of cache evictions in response cache", cache.evictions),
        ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
         cache.lookup_ns // 1000),
        ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
         cache.insertion_ns // 1000),
    )
    families = []
    for name, help_text, value in rows:
        fam = Family(name, "gauge", help_text)
        fam.add_plain(value)
        families.append(fam)
    return encode(families)
