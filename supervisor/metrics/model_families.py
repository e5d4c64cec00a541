"""Prometheus text exposition (format 0.0.4) for :8002/metrics, with Triton's metric names.

The text is built at scrape time from the StatsRegistry — the very counters behind the statistics
JSON, so both always agree (durations here are ``ns // 1000`` µs) — and the hot path pays nothing
for metrics. It is written by hand rather than through prometheus_client: prometheus_client would
rename every counter ``<name>_total``, which breaks Triton's names, and a hand-built scrape is an order
of magnitude cheaper than a prometheus_client Collector.
Label names are sorted, as prometheus-cpp does.

Things the stats do not hold (pending queue lengths, instance states, shared memory, the pinned memory pool's
size) come from the ``extra`` callback, called once per scrape and returning an ``ExtraMetrics`` snapshot.
docs/metrics.md lists every family and its labels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from . import latency_summary as ls
from .latency_histogram import FIRST_RESPONSE, FIRST_RESPONSE_HELP
from .model_statistics import FAILURE_REASONS, ModelStats, StatsRegistry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
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


@dataclass(slots=True)
class ExtraMetrics:
    pending: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, version) -> queued
    instances: Sequence[InstanceMetrics] = ()
    shm_bytes_in_use: int | None = None  # supervisor-owned shared memory (pools + client regions)
    shm_bytes_reserved: int | None = None
    pinned_pool_bytes: int | None = None  # --pinned-memory-pool-byte-size: Triton's nv_pinned_memory_pool_*


ExtraFn = Callable[[], ExtraMetrics]


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Family:
    """Lines of one metric family; written only when it has samples."""

    __slots__ = ("name", "lines")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def add(self, labels: str, value: float) -> None:
        self.lines.append(f"{self.name}{{{labels}}} {_fmt(value)}")

    def add_plain(self, value: float) -> None:
        self.lines.append(f"{self.name} {_fmt(value)}")


# (name, help, value getter) of the per-model counters, in Triton's order
_MODEL_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success_count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success_ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue_ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input_ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer_ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda s: s.compute_output_ns // 1000),
)

# in Triton's order and wording (tritonserver 2.51 with --cache-config local,size=...)
_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.cache_hit_count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.cache_hit_ns // 1000),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.cache_miss_count),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss_ns // 1000),
)


# the latency summaries (--metrics-config summary_latencies=true), in Triton's order and wording:
# (name, help, ring entry column, cumulative count, cumulative sum in µs)
_SUMMARIES: tuple[tuple[str, str, int, Callable[[ModelStats], int], Callable[[ModelStats], int]], ...] = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)",
     ls.REQUEST, lambda s: s.success_count, lambda s: s.success_ns // 1000),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)",
     ls.QUEUE, lambda s: s.success_count, lambda s: s.queue_ns // 1000),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     ls.COMPUTE_INPUT, lambda s: s.computed_count, lambda s: s.compute_input_ns // 1000),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     ls.COMPUTE_INFER, lambda s: s.computed_count, lambda s: s.compute_infer_ns // 1000),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     ls.COMPUTE_OUTPUT, lambda s: s.computed_count, lambda s: s.compute_output_ns // 1000),
)


def _summary_families(models: Sequence[ModelStats], labels: Sequence[str],
                      qs: Sequence[tuple[float, float]]) -> list[_Family]:
    """The five latency summaries of the versions that keep a latency ring: cumulative _count and _sum,
    then the quantiles over the window (NaN when no request finished in it); "quantile" comes last
    among the labels, as prometheus-cpp writes it."""
    rows = [(s, lab, s.latency.recent()) for s, lab in zip(models, labels, strict=True) if s.latency is not None]
    if not rows:
        return []
    q_labels = [f'quantile="{q:g}"' for q, _ in qs]
    q_values = [q for q, _ in qs]
    families = []
    for name, help_text, index, count, total in _SUMMARIES:
        fam = _Family(name, "summary", help_text)
        for s, lab, entries in rows:
            if index == ls.REQUEST and s.cache_enabled:
                continue  # as Triton (its FIXME DLIS-4762): no request summary for a model with the cache on
            fam.lines.append(f"{name}_count{{{lab}}} {count(s)}")
            fam.lines.append(f"{name}_sum{{{lab}}} {total(s)}")
            for q_lab, value in zip(q_labels, ls.quantiles(ls.column(entries, index), q_values), strict=True):
                fam.add(f"{lab},{q_lab}", value)
        if len(fam.lines) > 2:
            families.append(fam)
    for name, help_text, ring, count, total in _CACHE_SUMMARIES:
        fam = _Family(name, "summary", help_text)
        for s, lab, _ in rows:
            cache_ring = ring(s)
            if cache_ring is None:
                continue
            fam.lines.append(f"{name}_count{{{lab}}} {count(s)}")
            fam.lines.append(f"{name}_sum{{{lab}}} {total(s)}")
            values = ls.quantiles(ls.column(cache_ring.recent(), 1), q_values)
            for q_lab, value in zip(q_labels, values, strict=True):
                fam.add(f"{lab},{q_lab}", value)
        if len(fam.lines) > 2:
            families.append(fam)
    return families


# with summary_latencies, for the models with the response cache on, in Triton's order and wording:
# (name, help, the ring, cumulative count, cumulative sum in µs)
_CACHE_SUMMARIES: tuple[tuple[str, str, Callable[[ModelStats], ls.LatencyRing | None], Callable[[ModelStats], int],
                              Callable[[ModelStats], int]], ...] = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     lambda s: s.cache_hit_latency, lambda s: s.cache_hit_count, lambda s: s.cache_hit_ns // 1000),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     lambda s: s.cache_miss_latency, lambda s: s.cache_miss_count, lambda s: s.cache_miss_ns // 1000),
)


def _le(bound: float) -> str:
    """A bucket bound as prometheus-cpp writes it (%.16g, +Inf)."""
    return "+Inf" if bound == float("inf") else "%.16g" % bound


def _histogram_family(models: Sequence[ModelStats], labels: Sequence[str]) -> list[_Family]:
    """nv_inference_first_response_histogram_ms of the versions that keep one (histogram_latencies=true):
    _count, _sum, then the cumulative _bucket lines with "le" last, as prometheus-cpp writes them."""
    rows = [(s.first_response, lab) for s, lab in zip(models, labels, strict=True) if s.first_response is not None]
    if not rows:
        return []
    name = FIRST_RESPONSE
    fam = _Family(name, "histogram", FIRST_RESPONSE_HELP)
    for hist, lab in rows:
        fam.lines.append(f"{name}_count{{{lab}}} {hist.count}")
        fam.lines.append(f"{name}_sum{{{lab}}} {hist.total}")
        running = 0
        for bound, n in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
            running += n
            fam.lines.append(f'{name}_bucket{{{lab},le="{_le(bound)}"}} {running}')
    return [fam]


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


def _tags(s: ModelStats) -> str:
    """The model's metric_tags as labels "_<key>", sorted, with a trailing comma (Triton puts them on every
    per-model metric; every tag label sorts before model/reason/version and instance/state)."""
    # with --model-namespacing, its repository too (Triton's label "namespace": one name may be several models)
    namespace = f'namespace="{_escape(s.namespace)}",' if s.namespace else ""
    if not s.metric_tags:
        return namespace
    return "".join(f'_{key}="{_escape(value)}",' for key, value in sorted(s.metric_tags)) + namespace


def _model_families(models: Sequence[ModelStats], pending: Mapping[tuple[str, str], int],
                    latency: ls.LatencyMetricsConfig) -> list[_Family]:
    labels = [f'{_tags(s)}model="{_escape(s.name)}",version="{_escape(s.version)}"' for s in models]
    families: list[_Family] = []

    success_name, success_help, success_get = _MODEL_COUNTERS[0]
    fam = _Family(success_name, "counter", success_help)
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, success_get(s))
    families.append(fam)

    fam = _Family("nv_inference_request_failure", "counter",
                  "Number of failed inference requests, all batch sizes")
    for s in models:
        model, version, tags = _escape(s.name), _escape(s.version), _tags(s)
        for reason in FAILURE_REASONS:
            fam.add(f'{tags}model="{model}",reason="{reason}",version="{version}"',
                    s.fail_by_reason[reason])
    families.append(fam)

    for name, help_text, get in _MODEL_COUNTERS[1:]:
        if not latency.counters and name.endswith("_duration_us"):  # --metrics-config counter_latencies=false
            continue
        fam = _Family(name, "counter", help_text)
        for s, lab in zip(models, labels, strict=True):
            fam.add(lab, get(s))
        families.append(fam)

    fam = _Family("nv_inference_pending_request_count", "gauge",
                  "Instantaneous number of pending requests awaiting execution per-model.")
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, pending.get((s.name, s.version), 0))
    families.append(fam)

    fam = _Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, float(s.load_duration_s))
    families.append(fam)

    # as Triton: the per-model cache counters go with the latency counters (counter_latencies=false)
    cached = [(s, lab) for s, lab in zip(models, labels, strict=True) if s.cache_enabled and latency.counters]
    if cached:
        for name, help_text, get in _CACHE_COUNTERS:
            fam = _Family(name, "counter", help_text)
            for s, lab in cached:
                fam.add(lab, get(s))
            families.append(fam)

    fam = _Family("inferd_inference_request_items_total", "counter",
                  "Batch items in successful inference requests (includes cached requests)")
    for s, lab in zip(models, labels, strict=True):
        fam.add(lab, s.success_items)
    families.append(fam)
    families += _histogram_family(models, labels)
    families += _summary_families(models, labels, latency.quantiles)
    return families


def _pinned_families(total: int) -> list[_Family]:
    """Triton's pinned memory pool gauges. Without a GPU Triton allocates no pool and still reports the
    --pinned-memory-pool-byte-size it was given as the total, and 0 used; inferd has no pinned pool and
    reports the same."""
    fam_total = _Family("nv_pinned_memory_pool_total_bytes", "gauge", "Pinned memory pool total memory size, in bytes")
    fam_total.add_plain(total)
    fam_used = _Family("nv_pinned_memory_pool_used_bytes", "gauge", "Pinned memory pool used memory size, in bytes")
    fam_used.add_plain(0)
    return [fam_total, fam_used]


def _system_families() -> list[_Family]:
    mem = psutil.virtual_memory()
    fam_util = _Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
    fam_util.add_plain(_cpu.utilization())
    fam_total = _Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
    fam_total.add_plain(int(mem.total))
    fam_used = _Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
    fam_used.add_plain(int(mem.total - mem.available))
    return [fam_util, fam_total, fam_used]


def _instance_families(extra: ExtraMetrics, tags: Mapping[tuple[str, str], str]) -> list[_Family]:
    families: list[_Family] = []
    instances = sorted(extra.instances, key=lambda i: (i.model, i.version, i.instance))
    if instances:
        restarts = _Family("inferd_instance_restarts_total", "counter",
                           "Worker process restarts per model instance since the version loaded, by why the "
                           "worker before ended (exit, signal, hung, memory, recycled)")
        state = _Family("inferd_instance_state", "gauge",
                        "Model instance state: 1 for the current state, 0 for the others")
        inflight = _Family("inferd_instance_inflight_requests", "gauge",
                           "Requests sent to the model instance and not yet answered")
        for inst in instances:
            head = (f'{tags.get((inst.model, inst.version), "")}instance="{_escape(inst.instance)}",'
                    f'model="{_escape(inst.model)}"')
            version = f'version="{_escape(inst.version)}"'
            reasons = inst.restart_reasons
            for why in RESTART_REASONS if not reasons or set(reasons) <= set(RESTART_REASONS) else sorted(reasons):
                restarts.add(f'{head},reason="{_escape(why)}",{version}', reasons.get(why, 0))
            inflight.add(f"{head},{version}", inst.inflight)
            known = inst.state in INSTANCE_STATES
            for st in INSTANCE_STATES if known else (*INSTANCE_STATES, inst.state):
                state.add(f'{head},state="{_escape(st)}",{version}', 1 if st == inst.state else 0)
        families += [restarts, state, inflight]
    if extra.shm_bytes_in_use is not None:
        fam = _Family("inferd_shm_bytes_in_use", "gauge", "Shared memory bytes in use for tensors")
        fam.add_plain(extra.shm_bytes_in_use)
        families.append(fam)
    if extra.shm_bytes_reserved is not None:
        fam = _Family("inferd_shm_bytes_reserved", "gauge", "Shared memory bytes reserved by the pools")
        fam.add_plain(extra.shm_bytes_reserved)
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
    lines: list[str] = []
    for name, help_text, value in rows:
        fam = _Family(name, "gauge", help_text)
        fam.add_plain(value)
        lines += fam.lines
    lines.append("")
    return "\n".join(lines).encode()


def render_metrics(stats: StatsRegistry, extra: ExtraFn | None = None, system: bool = True) -> bytes:
    """The whole /metrics body. extra: called once, returns pending counts, instances and shm use."""
    snapshot = extra() if extra is not None else ExtraMetrics()
    models = stats.all()
    families: list[_Family] = []
    if models:
        families += _model_families(models, snapshot.pending, stats.latency_config)
    if snapshot.pinned_pool_bytes is not None:
        families += _pinned_families(snapshot.pinned_pool_bytes)
    if system:
        families += _system_families()
    families += _instance_families(snapshot, {(s.name, s.version): _tags(s) for s in models if s.metric_tags})
    lines: list[str] = []
    for fam in families:
        lines += fam.lines
    lines.append("")
    return "\n".join(lines).encode()



@dataclass(slots=True)
class GpuSample:
    """One GPU's NVML readings (gpu_metrics.py), in Triton's units."""

    uuid: str
    utilization: float  # 0..1
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_w: float
    power_limit_w: float
    energy_j: float  # since the server started


def render_gpu_metrics(samples: Sequence[GpuSample]) -> bytes:
    """Triton's per-GPU families (names, HELP texts and the gpu_uuid label as tritonserver 2.51 has them)."""
    if not samples:
        return b""
    rows: tuple[tuple[str, str, str, Callable[[GpuSample], float]], ...] = (
        ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", lambda s: s.utilization),
        ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", lambda s: s.memory_total_bytes),
        ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", lambda s: s.memory_used_bytes),
        ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", lambda s: s.power_usage_w),
        ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", lambda s: s.power_limit_w),
        ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started",
         lambda s: s.energy_j),
    )
    lines: list[str] = []
    for name, kind, help_text, value in rows:
        fam = _Family(name, kind, help_text)
        for s in samples:
            fam.add(f'gpu_uuid="{_escape(s.uuid)}"', value(s))
        lines += fam.lines
    lines.append("")
    return "\n".join(lines).encode()
