"""Per (model, version) inference statistics: the statistics extension JSON and the metrics source.

Recording happens on the supervisor's one asyncio thread, so it is plain integer arithmetic on
attributes of a ``__slots__`` object: no locks, no allocation on the hot path (except the first
time a batch size or a failure reason is seen). The core keeps the ``ModelStats`` it got from
``StatsRegistry.get`` when a version loads and records into it directly; readers (the statistics
endpoints and the metrics scrape) turn the counters into JSON or Prometheus text on demand.

Counting rules follow Triton (reference/triton.md §7.2):
- per request: ``success``/``fail`` and their durations, ``queue``, ``compute_*`` (each request of a
  batch is charged the whole batch's compute durations) — ``record_success``/``record_failure``;
- per execution: ``execution_count``, ``inference_count`` (batch items), ``batch_stats`` —
  ``record_execution``;
- a response-cache hit counts as a success (and queue) but not as an inference, an execution or
  compute time — ``record_cache_hit``; a miss only adds the lookup/insert time — ``record_cache_miss``;
- the first-response histogram (``--metrics-config histogram_latencies=true``) observes a request's first
  response: for a model that is not decoupled its end, success or failure (``record_*`` with the request's
  duration; a refusal before it was queued, recorded with 0, has no response), for a decoupled one the
  first response its stream gets (core.streaming.ResponseStream calls ``first_response.observe_ns``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from inferd.worker.wire.errors import invalid_arg

from .latency_histogram import DEFAULT_BUCKETS, FIRST_RESPONSE, Histogram
from .latency_summary import LatencyMetricsConfig, LatencyRing

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")  # Triton's /metrics order


class ModelStats:
    """Counters of one model version. Durations are nanosecond totals.

    Counts that always move together are stored once: queue count = success_count (cache hits
    included), compute_* count = success_count - cache_hit_count (computed_count).
    """

    __slots__ = (
        "name",
        "namespace",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "success_count",
        "success_ns",
        "success_items",
        "fail_count",
        "fail_ns",
        "fail_by_reason",
        "queue_ns",
        "compute_input_ns",
        "compute_infer_ns",
        "compute_output_ns",
        "cache_hit_count",
        "cache_hit_ns",
        "cache_miss_count",
        "cache_miss_ns",
        "batch_stats",
        "load_duration_s",
        "cache_enabled",
        "metric_tags",
        "latency",
        "decoupled",
        "first_response",
        "cache_hit_latency",
        "cache_miss_latency",
    )

    def __init__(self, name: str, version: str, namespace: str = "") -> None:
        self.name = name
        self.version = version
        self.namespace = namespace  # its repository, with --model-namespacing (label "namespace" on its metrics)
        self.last_inference = 0  # ms since the epoch of the last request that finished
        self.inference_count = 0
        self.execution_count = 0
        self.success_count = 0
        self.success_ns = 0
        self.success_items = 0  # batch items of successful requests (cache hits included)
        self.fail_count = 0
        self.fail_ns = 0
        self.fail_by_reason: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self.queue_ns = 0
        self.compute_input_ns = 0
        self.compute_infer_ns = 0
        self.compute_output_ns = 0
        self.cache_hit_count = 0
        self.cache_hit_ns = 0
        self.cache_miss_count = 0
        self.cache_miss_ns = 0
        # batch size -> [executions, input_ns, infer_ns, output_ns]
        self.batch_stats: dict[int, list[int]] = {}
        self.load_duration_s = 0.0  # set by the repository when the version becomes READY
        self.cache_enabled = False  # response cache on for this model: export nv_cache_* metrics
        self.metric_tags: tuple[tuple[str, str], ...] = ()  # config metric_tags: labels "_<key>" on its metrics
        # recent requests' durations for the latency summaries (--metrics-config summary_latencies=true)
        self.latency: LatencyRing | None = None
        self.decoupled = False  # its first responses are observed by its streams, not by record_*
        self.first_response: Histogram | None = None  # --metrics-config histogram_latencies=true
        # the cache hit / miss durations for nv_cache_{hit,miss}_summary_per_model (summaries, cache on)
        self.cache_hit_latency: LatencyRing | None = None
        self.cache_miss_latency: LatencyRing | None = None

    # ---- hot path ----
    def record_success(
        self,
        batch_items: int = 1,
        request_ns: int = 0,
        queue_ns: int = 0,
        compute_input_ns: int = 0,
        compute_infer_ns: int = 0,
        compute_output_ns: int = 0,
    ) -> None:
        """One request that completed. Does not touch inference/execution counts (record_execution)."""
        self.success_count += 1
        self.success_ns += request_ns
        self.success_items += batch_items
        self.queue_ns += queue_ns
        self.compute_input_ns += compute_input_ns
        self.compute_infer_ns += compute_infer_ns
        self.compute_output_ns += compute_output_ns
        now_ms = self.last_inference = time.time_ns() // 1_000_000
        if self.latency is not None:
            self.latency.entries.append((now_ms, request_ns // 1000, queue_ns // 1000, compute_input_ns // 1000,
                                         compute_infer_ns // 1000, compute_output_ns // 1000))
        if self.first_response is not None and not self.decoupled:
            self.first_response.observe_ns(request_ns)

    def record_successes(self, arrivals: Sequence[int], start_ns: int, end_ns: int, compute_input_ns: int,
                         compute_infer_ns: int, compute_output_ns: int) -> None:
        """The requests of one batch (arrival times) that completed, each of one batch item, the batch sent
        at `start_ns` and answered at `end_ns`: `record_success` for each, in one update unless the latency
        summaries keep every request."""
        if self.latency is not None or self.first_response is not None:
            for arrival in arrivals:
                self.record_success(1, end_ns - arrival, start_ns - arrival, compute_input_ns, compute_infer_ns,
                                    compute_output_ns)
            return
        count = len(arrivals)
        total = sum(arrivals)
        self.success_count += count
        self.success_ns += end_ns * count - total
        self.success_items += count
        self.queue_ns += start_ns * count - total
        self.compute_input_ns += compute_input_ns * count
        self.compute_infer_ns += compute_infer_ns * count
        self.compute_output_ns += compute_output_ns * count
        self.last_inference = time.time_ns() // 1_000_000

    def record_failure(self, reason: str, request_ns: int = 0) -> None:
        """One request that failed. reason: REJECTED (queue full/timeout), CANCELED, BACKEND, OTHER."""
        self.fail_count += 1
        self.fail_ns += request_ns
        if request_ns and self.first_response is not None and not self.decoupled:  # answered with an error
            self.first_response.observe_ns(request_ns)
        by_reason = self.fail_by_reason
        if reason in by_reason:
            by_reason[reason] += 1
        else:
            by_reason["OTHER"] += 1
        self.last_inference = time.time_ns() // 1_000_000

    def record_execution(
        self,
        batch_size: int,
        compute_input_ns: int = 0,
        compute_infer_ns: int = 0,
        compute_output_ns: int = 0,
    ) -> None:
        """One batch executed by an instance; batch_size = batch items in it (1 without batching)."""
        self.execution_count += 1
        self.inference_count += batch_size
        entry = self.batch_stats.get(batch_size)
        if entry is None:
            self.batch_stats[batch_size] = [1, compute_input_ns, compute_infer_ns, compute_output_ns]
        else:
            entry[0] += 1
            entry[1] += compute_input_ns
            entry[2] += compute_infer_ns
            entry[3] += compute_output_ns

    def record_cache_hit(self, ns: int, request_ns: int = 0, queue_ns: int = 0, batch_items: int = 1) -> None:
        """A request answered from the response cache: a success, never an inference or execution."""
        self.cache_hit_count += 1
        self.cache_hit_ns += ns
        self.success_count += 1
        self.success_ns += request_ns
        self.success_items += batch_items
        self.queue_ns += queue_ns
        now_ms = self.last_inference = time.time_ns() // 1_000_000
        if self.latency is not None:  # a cache hit has no compute durations
            self.latency.entries.append((now_ms, request_ns // 1000, queue_ns // 1000, None, None, None))
        if self.cache_hit_latency is not None:
            self.cache_hit_latency.entries.append((now_ms, ns // 1000))
        if self.first_response is not None and not self.decoupled:
            self.first_response.observe_ns(request_ns)

    def record_cache_miss(self, ns: int) -> None:
        """Time spent on a cache lookup (and insert) that missed; the request then runs normally."""
        self.cache_miss_count += 1
        self.cache_miss_ns += ns
        if self.cache_miss_latency is not None:
            self.cache_miss_latency.entries.append((time.time_ns() // 1_000_000, ns // 1000))

    # ---- readers ----
    @property
    def computed_count(self) -> int:
        """Requests charged compute durations: successes that were not cache hits."""
        return self.success_count - self.cache_hit_count

    def to_json(self) -> dict[str, Any]:
        """One entry of "model_stats" (reference/triton.md §7.2)."""
        computed = self.computed_count
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": _d(self.success_count, self.success_ns),
                "fail": _d(self.fail_count, self.fail_ns),
                "queue": _d(self.success_count, self.queue_ns),
                "compute_input": _d(computed, self.compute_input_ns),
                "compute_infer": _d(computed, self.compute_infer_ns),
                "compute_output": _d(computed, self.compute_output_ns),
                "cache_hit": _d(self.cache_hit_count, self.cache_hit_ns),
                "cache_miss": _d(self.cache_miss_count, self.cache_miss_ns),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": _d(entry[0], entry[1]),
                    "compute_infer": _d(entry[0], entry[2]),
                    "compute_output": _d(entry[0], entry[3]),
                }
                for size, entry in sorted(self.batch_stats.items())
            ],
            "memory_usage": [],
        }


def _d(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


class StatsRegistry:
    """Every loaded model version's ModelStats, keyed by (name, version, namespace); the namespace is "" unless
    --model-namespacing (then a name may be in several repositories: core/namespaces.py)."""

    __slots__ = ("_stats", "latency_config")

    def __init__(self, latency_config: LatencyMetricsConfig | None = None) -> None:
        self._stats: dict[tuple[str, str, str], ModelStats] = {}
        self.latency_config = latency_config or LatencyMetricsConfig()  # --metrics-config

    def get(self, model: str, version: str | int, namespace: str = "") -> ModelStats:
        """The version's stats, created on first use (call it when the version loads; keep the object)."""
        key = (model, str(version), namespace)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = ModelStats(model, key[1], namespace)
            cfg = self.latency_config
            if cfg.summaries:
                stats.latency = LatencyRing(cfg.capacity, cfg.max_age_s)
        return stats

    def configure(self, stats: ModelStats, *, decoupled: bool, cache_enabled: bool,
                  buckets: dict[str, tuple[float, ...]] | None = None) -> None:
        """What a loaded version's config means for its figures: decoupled (who observes first responses), the
        response cache (nv_cache_* per model) and, with histogram_latencies, the first-response histogram with
        the config's buckets (`buckets`: latency_histogram.bucket_overrides). A histogram that exists already
        (the version reloaded while it served) keeps its buckets: as in Triton, new ones apply after an unload."""
        cfg = self.latency_config
        stats.decoupled = decoupled
        stats.cache_enabled = cache_enabled
        if cfg.histograms and stats.first_response is None:
            stats.first_response = Histogram((buckets or {}).get(FIRST_RESPONSE, DEFAULT_BUCKETS))
        if cfg.summaries and cache_enabled and stats.cache_hit_latency is None:
            stats.cache_hit_latency = LatencyRing(cfg.capacity, cfg.max_age_s)
            stats.cache_miss_latency = LatencyRing(cfg.capacity, cfg.max_age_s)

    def find(self, model: str, version: str | int, namespace: str = "") -> ModelStats | None:
        return self._stats.get((model, str(version), namespace))

    def remove(self, model: str, version: str | int, namespace: str = "") -> None:
        """Forget a version (on unload): Triton reports statistics of live versions only."""
        self._stats.pop((model, str(version), namespace), None)

    def __len__(self) -> int:
        return len(self._stats)

    def all(self) -> list[ModelStats]:
        """Every version's stats, sorted by model name then numeric version."""
        return [self._stats[k] for k in sorted(self._stats, key=lambda k: (k[0], _version_key(k[1]), k[2]))]

    def select(self, name: str = "", version: str | int = "") -> list[ModelStats]:
        """The stats a statistics request names; raises InferdError for an unknown model or version."""
        if not name:
            return self.all()
        versions = [s for s in self.all() if s.name == name]
        if not versions or len({s.namespace for s in versions}) > 1:  # (several: Triton's answer, ambiguous)
            raise invalid_arg(f"requested model '{name}' is not available")
        version = str(version)
        if not version:
            return versions
        chosen = [s for s in versions if s.version == version]
        if not chosen:
            raise invalid_arg(f"requested model version is not available for model '{name}'")
        return chosen

    def to_json(self, name: str = "", version: str | int = "") -> dict[str, Any]:
        """{"model_stats": [...]}: every model (every version) when name is empty."""
        return {"model_stats": [s.to_json() for s in self.select(name, version)]}
