"""The worker's custom metrics: what `pb_utils.MetricFamily` / `Metric` hold, and the reports about them.

A model's families and metrics live here, one registry per worker process (`REGISTRY`). Every change
is recorded under one lock (a model may update metrics from any thread) and marked for the next
report; the heartbeat thread calls `report()` once per interval and sends what it returns as a
`MetricsReport` on the worker's "<identity>/metrics" socket; and after each metric call of the model,
pb_utils calls `applied()`, which sends the change and waits for the supervisor (MetricsSender.sync), so
/metrics shows a change once the call returned, as in Triton. Values are cumulative, so a report that is
lost costs nothing but the next one being complete (`resend_all`).

Lifetime follows Triton's Python backend: a family lives as long as its `MetricFamily` object, and
its metrics go with it (a `Metric` kept after that raises on use); a worker's metrics go with the
worker. Several `Metric()` calls with the same labels on one family share one metric.

Runs on Python 3.9+ with the standard library only.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from .wire import metric_rules as rules
from .wire.messages import MetricsReport

FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
    "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)
_OPS = {
    "increment": ("Failed to increment metric value", "Increment"),
    "set": ("Failed to set metric value", "Set"),
    "observe": ("Failed to observe metric value", "Observe"),
    "value": ("Failed to get metric value", "Value"),
}
_KIND_CONSTANTS = {rules.COUNTER: "COUNTER", rules.GAUGE: "GAUGE", rules.HISTOGRAM: "HISTOGRAM"}


class MetricError(Exception):
    """A metric operation the model asked for cannot be done; the text says why (pb_utils raises it as
    TritonModelException)."""


class Family:
    __slots__ = ("fid", "name", "description", "kind", "metrics", "alive")

    def __init__(self, fid: int, name: str, description: str, kind: int) -> None:
        self.fid = fid
        self.name = name
        self.description = description
        self.kind = kind
        self.metrics: dict[tuple[tuple[str, str], ...], MetricState] = {}
        self.alive = True


class MetricState:
    __slots__ = ("mid", "family", "labels", "buckets", "value", "sets", "set_value", "set_ns", "incs",
                 "incs_at_set", "counts", "sum")

    def __init__(self, mid: int, family: Family, labels: dict[str, str], buckets: tuple[float, ...]) -> None:
        self.mid = mid
        self.family = family
        self.labels = labels
        self.buckets = buckets
        self.value = 0.0  # counter total, gauge value
        self.sets = 0  # gauge: set() calls, the last one's value and time (CLOCK_MONOTONIC, host-wide)
        self.set_value = 0.0
        self.set_ns = 0
        self.incs = 0.0  # gauge: sum of all increments, and what it was at the last set()
        self.incs_at_set = 0.0
        self.counts = [0] * (len(buckets) + 1) if family.kind == rules.HISTOGRAM else []
        self.sum = 0.0  # histogram: sum of observations


def _number(value: Any, what: str) -> float:
    if isinstance(value, (str, bytes, bytearray, bool)) or value is None:
        raise TypeError("%s(): a number is required, not %s" % (what, type(value).__name__))
    return float(value)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fids = itertools.count(1)
        self._mids = itertools.count(1)
        self._families: dict[int, Family] = {}
        self._kinds: dict[str, list[int]] = {}  # family name -> [kind, live families of that name]
        self._metric_count = 0
        # not yet reported: new families and metrics, changed values, dropped (already reported) families
        self._new_families: dict[int, Family] = {}
        self._new_metrics: dict[int, MetricState] = {}
        self._dirty: dict[int, MetricState] = {}
        self._dropped: list[int] = []
        self._full = False
        # families whose MetricFamily object is gone, not yet dropped (see drop_family)
        self._gone: collections.deque[int] = collections.deque()
        self.instance = ""  # the model instance, named in errors as Triton names it
        self.source = ""  # "model 'm' instance 'm_0'", for the supervisor's warnings
        self.sync: Optional[Callable[[], None]] = None  # set by the worker: MetricsSender.sync

    def applied(self) -> None:
        """After a model's metric call changed something: return once the supervisor has it (see sync)."""
        sync = self.sync
        if sync is not None:
            sync()

    # ---- families and metrics ----
    def add_family(self, name: Any, description: Any, kind: Any) -> Family:
        error = rules.family_error(name, description, kind)
        if error is not None:
            raise MetricError("Error when creating MetricFamily: " + error)
        with self._lock:
            self._drop_gone()
            seen = self._kinds.get(name)
            if seen is not None and seen[0] != kind:
                raise MetricError(
                    "Error when creating MetricFamily: metric family '%s' already exists as a %s, not a %s"
                    % (name, rules.KIND_NAMES[seen[0]], rules.KIND_NAMES[kind]))
            if len(self._families) >= rules.MAX_FAMILIES:
                raise MetricError("Error when creating MetricFamily: a model instance may have at most %d metric "
                                  "families alive at once" % rules.MAX_FAMILIES)
            family = Family(next(self._fids), name, description, kind)
            self._families[family.fid] = family
            if seen is None:
                self._kinds[name] = [kind, 1]
            else:
                seen[1] += 1
            self._new_families[family.fid] = family
        return family

    def drop_family(self, fid: int) -> None:
        """The family's MetricFamily object is gone: so are the family and its metrics, from the next
        operation on. The object's finalizer calls this, and the garbage collector runs finalizers
        wherever an allocation sets it off, even inside this registry's locked sections on the same
        thread: taking the lock here could deadlock, so the fid is only noted (deque.append is atomic)."""
        self._gone.append(fid)

    def _drop_gone(self) -> None:
        """Drop the families noted by drop_family; every locked section starts with it."""
        gone = self._gone
        while gone:
            family = self._families.pop(gone.popleft(), None)
            if family is None:
                continue
            family.alive = False
            seen = self._kinds.get(family.name)
            if seen is not None:
                seen[1] -= 1
                if seen[1] <= 0:
                    del self._kinds[family.name]
            self._metric_count -= len(family.metrics)
            for metric in family.metrics.values():
                self._new_metrics.pop(metric.mid, None)
                self._dirty.pop(metric.mid, None)
            if self._new_families.pop(family.fid, None) is None:
                self._dropped.append(family.fid)  # the supervisor has heard of it

    def add_metric(self, family: Family, labels: Any, buckets: Any) -> MetricState:
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise MetricError("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, (list, tuple)):
                raise MetricError("Failed to create metric. Buckets must be a list.")
            if family.kind != rules.HISTOGRAM:
                raise MetricError("Failed to create metric. Unexpected buckets found.")
        elif family.kind == rules.HISTOGRAM:
            raise MetricError("Failed to create metric. Missing required buckets.")
        error = rules.labels_error(labels)
        if error is not None:
            raise MetricError("Error when creating Metric: " + error)
        bounds: tuple[float, ...] = ()
        if buckets is not None:
            try:
                bounds = rules.check_buckets(buckets)
            except ValueError as exc:
                raise MetricError("Error when creating Metric: %s" % exc) from None
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._drop_gone()
            if not family.alive:
                raise MetricError("Error when creating Metric: " + FAMILY_DELETED)
            metric = family.metrics.get(key)
            if metric is not None:  # the same labels again: the same metric (its first buckets stay)
                return metric
            if self._metric_count >= rules.MAX_METRICS:
                raise MetricError("Error when creating Metric: a model instance may have at most %d metrics "
                                  "(label sets) alive at once" % rules.MAX_METRICS)
            metric = MetricState(next(self._mids), family, dict(key), bounds)
            family.metrics[key] = metric
            self._metric_count += 1
            self._new_metrics[metric.mid] = metric
        return metric

    # ---- operations ----
    def _refuse(self, metric: MetricState, op: str) -> MetricError:
        prefix, verb = _OPS[op]
        if not metric.family.alive:
            return MetricError("%s: %s" % (prefix, FAMILY_DELETED))
        return MetricError("%s: Failed to process the request for model '%s', message: "
                           "TRITONSERVER_METRIC_KIND_%s does not support %s"
                           % (prefix, self.instance, _KIND_CONSTANTS[metric.family.kind], verb))

    def increment(self, metric: MetricState, value: Any) -> None:
        amount = _number(value, "increment")
        with self._lock:
            self._drop_gone()
            kind = metric.family.kind
            if not metric.family.alive or kind == rules.HISTOGRAM:
                raise self._refuse(metric, "increment")
            if kind == rules.COUNTER:
                if amount < 0:
                    raise MetricError(
                        "Failed to increment metric value: Failed to process the request for model '%s', message: "
                        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                        "values." % self.instance)
            else:
                metric.incs += amount
            metric.value += amount
            self._dirty[metric.mid] = metric

    def set(self, metric: MetricState, value: Any) -> None:
        number = _number(value, "set")
        with self._lock:
            self._drop_gone()
            if not metric.family.alive or metric.family.kind != rules.GAUGE:
                raise self._refuse(metric, "set")
            metric.value = metric.set_value = number
            metric.sets += 1
            metric.set_ns = time.monotonic_ns()
            metric.incs_at_set = metric.incs
            self._dirty[metric.mid] = metric

    def observe(self, metric: MetricState, value: Any) -> None:
        number = _number(value, "observe")
        with self._lock:
            self._drop_gone()
            if not metric.family.alive or metric.family.kind != rules.HISTOGRAM:
                raise self._refuse(metric, "observe")
            # le semantics: the first bucket whose bound is >= the value; NaN lands in +Inf, as in prometheus-cpp
            index = len(metric.buckets) if number != number else bisect.bisect_left(metric.buckets, number)
            metric.counts[index] += 1
            metric.sum += number
            self._dirty[metric.mid] = metric

    def value(self, metric: MetricState) -> float:
        with self._lock:
            self._drop_gone()
            if not metric.family.alive or metric.family.kind == rules.HISTOGRAM:
                raise self._refuse(metric, "value")
            return metric.value

    # ---- reports ----
    def pending(self) -> bool:
        return bool(self._full or self._new_families or self._new_metrics or self._dirty or self._dropped
                    or self._gone)

    def resend_all(self) -> None:
        """A report was lost: make the next one complete."""
        with self._lock:
            self._drop_gone()
            self._full = True

    def report(self) -> Optional[MetricsReport]:
        """What changed since the previous report (everything, after `resend_all`); None: nothing did."""
        if not self.pending():
            return None
        with self._lock:
            self._drop_gone()
            if not self.pending():  # only families made and dropped since the last report
                return None
            full = self._full
            if full:
                families = list(self._families.values())
                metrics = [metric for family in families for metric in family.metrics.values()]
                changed = metrics
                dropped: list[int] = []
            else:
                families = list(self._new_families.values())
                metrics = list(self._new_metrics.values())
                changed = list(self._dirty.values())
                dropped = self._dropped
            message = MetricsReport(
                full=full,
                source=self.source if full or families else "",
                families=[[f.fid, f.name, f.description, f.kind] for f in families],
                metrics=[[m.mid, m.family.fid, m.labels,
                          list(m.buckets) if m.family.kind == rules.HISTOGRAM else None] for m in metrics],
                values=[_values(m) for m in changed],
                dropped=list(dropped),
            )
            self._new_families = {}
            self._new_metrics = {}
            self._dirty = {}
            self._dropped = []
            self._full = False
        return message

    def clear(self) -> None:
        """Forget everything, reporting nothing about it (tests)."""
        with self._lock:
            self._gone.clear()
            for family in self._families.values():
                family.alive = False
            self._families = {}
            self._kinds = {}
            self._metric_count = 0
            self._new_families = {}
            self._new_metrics = {}
            self._dirty = {}
            self._dropped = []
            self._full = False


def _values(metric: MetricState) -> list[Any]:
    kind = metric.family.kind
    number = rules.encode_number
    if kind == rules.COUNTER:
        return [metric.mid, number(metric.value)]
    if kind == rules.GAUGE:
        return [metric.mid, number(metric.set_value), metric.sets, number(metric.incs), number(metric.incs_at_set),
                metric.set_ns]
    return [metric.mid, number(metric.sum), *metric.counts]


REGISTRY = Registry()
