"""The /metrics body: the registry's counters plus the gauges read from the loaded models at scrape time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import model_families as metrics_mod


def metrics_renderer(registry: Any, manager: Any, runtime: Any, cpu_metrics: bool = True,
                     pinned_pool_bytes: int | None = None) -> Callable[[], bytes]:
    """The /metrics body; `cpu_metrics`: with the nv_cpu_* gauges (--allow-cpu-metrics); `pinned_pool_bytes`:
    the total of Triton's nv_pinned_memory_pool_* gauges (--pinned-memory-pool-byte-size)."""

    def extra() -> metrics_mod.ExtraMetrics:
        pending: dict[tuple[str, str], int] = {}
        instances: list[metrics_mod.InstanceMetrics] = []
        for mv in manager.loaded_versions():
            pending[(mv.name, str(mv.version))] = mv.scheduler.pending_count
            for inst in mv.instances:
                state = inst.state.value
                instances.append(metrics_mod.InstanceMetrics(
                    mv.name, str(mv.version), inst.name,
                    state if state in metrics_mod.INSTANCE_STATES else "starting",
                    restarts=inst.restarts, restart_reasons=dict(inst.restart_reasons), inflight=inst.inflight))
        return metrics_mod.ExtraMetrics(pending=pending, instances=instances,
                                        shm_bytes_in_use=runtime.pool.in_use_bytes,
                                        shm_bytes_reserved=runtime.pool.total_bytes,
                                        pinned_pool_bytes=pinned_pool_bytes)

    return lambda: metrics_mod.render_metrics(registry, extra=extra, system=cpu_metrics)
