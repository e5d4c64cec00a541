"""Custom metrics of Python models (`pb_utils.MetricFamily` / `Metric`), merged and rendered for /metrics.

Every worker whose model makes metrics reports them on its "<identity>/metrics" socket (a
`MetricsReport`, at most one per heartbeat interval, only when something changed, and one after each
metric call of the model, which waits for our `MetricsAck`: wire.messages and docs/worker-protocol.md).
The merge follows Triton, whose metric registry is one per server process
while every instance runs its own Python stub: a family is one name server-wide, and one family name
with one label set, from any instance of any model, is one metric. Counters and histograms add up what
every instance counted; a gauge takes the latest `set()` and then every instance's increments (to
within a heartbeat: reports are the order of events the supervisor sees).

A metric is exported while some worker holds it: a family goes when its `MetricFamily` object is
garbage collected in the worker, and everything a worker held goes when the worker exits (unload,
restart). What a departing worker counted stays in a metric other workers still hold. (Triton 2.51
keeps exporting an unloaded model's metrics until the server exits; inferd does not.)

Nothing a worker reports is trusted: names, labels and buckets are checked again (wire.custom_metrics),
the per-worker bounds apply again, and a server-wide bound caps the exported label sets. Conflicts
(one name reported as two kinds, one histogram with two bucket layouts) keep what came first; the
rest is not exported and the server log says so once per worker.
"""

from __future__ import annotations

import logging
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire import metric_rules as rules
from inferd.worker.wire.errors import InferdError

log = logging.getLogger("inferd.custom_metrics")

MAX_SERIES = 50_000  # label sets exported over all families, server-wide
MAX_FAMILIES = 10_000
_MAX_WARNINGS = 50  # distinct warnings logged per worker

LabelKey = tuple[tuple[str, str], ...]


class _Contribution:
    """What one worker's metric has counted (cumulative, as last reported)."""

    __slots__ = ("total", "sets", "incs", "incs_at_base", "counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.total = 0.0  # counter
        self.sets = 0  # gauge: set() calls seen
        self.incs = 0.0  # gauge: sum of its increments
        self.incs_at_base = 0.0  # gauge: `incs` when the series' base was set (what came after counts)
        self.counts = [0] * (buckets + 1)  # histogram
        self.sum = 0.0


class _Series:
    """One exported metric: a family name and a label set, fed by every worker holding it."""

    __slots__ = ("labels", "buckets", "contribs", "retired", "base", "base_ns", "retired_counts", "retired_sum")

    def __init__(self, labels: LabelKey, buckets: tuple[float, ...]) -> None:
        self.labels = labels
        self.buckets = buckets
        self.contribs: dict[tuple[str, int], _Contribution] = {}
        self.retired = 0.0  # counter: totals of contributions that left
        self.base = 0.0  # gauge: value of the latest set(), plus increments of contributions that left
        self.base_ns = -1  # gauge: when that set() was (CLOCK_MONOTONIC ns)
        self.retired_counts = [0] * (len(buckets) + 1)
        self.retired_sum = 0.0

    def counter_value(self) -> float:
        return self.retired + sum(c.total for c in self.contribs.values())

    def gauge_value(self) -> float:
        return self.base + sum(c.incs - c.incs_at_base for c in self.contribs.values())

    def histogram(self) -> tuple[list[int], float]:
        counts = list(self.retired_counts)
        total = self.retired_sum
        for c in self.contribs.values():
            for i, n in enumerate(c.counts):
                counts[i] += n
            total += c.sum
        return counts, total


class _Family:
    __slots__ = ("name", "kind", "help", "series", "holders")

    def __init__(self, name: str, kind: int, help_text: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text  # the first description wins, as in Triton
        self.series: dict[LabelKey, _Series] = {}
        self.holders = 0  # worker families (MetricFamily objects) of this name alive


class _Worker:
    __slots__ = ("source", "families", "family_mids", "metrics", "warned")

    def __init__(self) -> None:
        self.source = "a worker"
        self.families: dict[int, _Family | None] = {}  # fid -> family (None: not exported)
        self.family_mids: dict[int, set[int]] = {}
        self.metrics: dict[int, tuple[_Family, _Series, _Contribution] | None] = {}  # mid -> (None: not exported)
        self.warned: set[str] = set()


class CustomMetrics:
    """The server's custom metrics; `attach(channel)` routes the workers' reports here."""

    def __init__(self) -> None:
        self._channel: Any = None
        self._families: dict[str, _Family] = {}  # in order of first appearance
        self._workers: dict[str, _Worker] = {}
        self._series = 0

    def attach(self, channel: Any) -> None:
        self._channel = channel
        channel.route_suffix(rules.SUFFIX, self._on_message, self.forget)

    def _on_message(self, identity: str, frames: list[Any]) -> None:
        worker = identity.split("/", 1)[0]
        try:
            message, _ = m.decode(frames)
        except m.ProtocolError as exc:
            self._warn(self._view(worker), f"sent a malformed metrics report ({exc})")
            return
        if not isinstance(message, m.MetricsReport):
            self._warn(self._view(worker), f"sent {type(message).__name__} on its metrics socket")
            return
        self.apply(worker, message)
        if message.ack > 0:  # a metric call waits for this: what it changed is now on /metrics
            try:
                self._channel.send(identity, m.encode(m.MetricsAck(seq=message.ack)))
            except InferdError:
                pass  # the worker is gone

    # ---- worker reports ----
    def apply(self, worker: str, report: m.MetricsReport) -> None:
        view = self._view(worker)
        if isinstance(report.source, str) and report.source:
            view.source = report.source[:300]
        try:
            if report.full:
                self._keep_only(worker, view, report)
            for fid in report.dropped:
                self._drop_family(worker, view, fid)
            for fdef in report.families:
                self._define_family(view, fdef)
            for mdef in report.metrics:
                self._define_metric(worker, view, mdef)
            for values in report.values:
                self._update(view, values)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
            self._warn(view, f"sent a malformed metrics report ({exc!r})")

    def forget(self, worker: str) -> None:
        """The worker is gone: so is every metric it held."""
        view = self._workers.pop(worker, None)
        if view is not None:
            for fid in list(view.families):
                self._drop_family(worker, view, fid)

    def _view(self, worker: str) -> _Worker:
        view = self._workers.get(worker)
        if view is None:
            view = self._workers[worker] = _Worker()
        return view

    def _warn(self, view: _Worker, text: str) -> None:
        if text not in view.warned and len(view.warned) < _MAX_WARNINGS:
            view.warned.add(text)
            log.warning("custom metrics of %s: %s", view.source, text)

    def _keep_only(self, worker: str, view: _Worker, report: m.MetricsReport) -> None:
        """A full report: what it does not list is gone."""
        fids = {fdef[0] for fdef in report.families if isinstance(fdef, list) and fdef}
        mids = {mdef[0] for mdef in report.metrics if isinstance(mdef, list) and mdef}
        for mid in [mid for mid in view.metrics if mid not in mids]:
            self._drop_metric(worker, view, mid)
        for fid in [fid for fid in view.families if fid not in fids]:
            self._drop_family(worker, view, fid)

    def _define_family(self, view: _Worker, fdef: list[Any]) -> None:
        fid, name, description, kind = fdef
        if type(fid) is not int or fid in view.families:
            return
        if len(view.families) >= rules.MAX_FAMILIES:
            self._warn(view, f"more than {rules.MAX_FAMILIES} metric families; the others are not exported")
            return
        error = rules.family_error(name, description, kind)
        family = self._families.get(name) if error is None else None
        if error is not None:
            self._warn(view, f"metric family {str(name)[:60]!r} not exported: {error}")
        elif family is not None and family.kind != kind:
            self._warn(view, f"metric family '{name}' is a {rules.KIND_NAMES[kind]} here but already exported as a "
                             f"{rules.KIND_NAMES[family.kind]} (by another model instance): not exported")
            family = None
        elif family is None:
            if len(self._families) >= MAX_FAMILIES:
                self._warn(view, f"the server exports {MAX_FAMILIES} custom metric families already: "
                                 f"'{name}' is not exported")
            else:
                family = self._families[name] = _Family(name, kind, description)
        if family is not None:
            family.holders += 1
        view.families[fid] = family
        view.family_mids[fid] = set()

    def _define_metric(self, worker: str, view: _Worker, mdef: list[Any]) -> None:
        mid, fid, labels, buckets = mdef
        if type(mid) is not int or mid in view.metrics or fid not in view.families:
            return
        family = view.families[fid]
        if family is None:
            return
        if len(view.metrics) >= rules.MAX_METRICS:
            self._warn(view, f"more than {rules.MAX_METRICS} metrics; the others are not exported")
            return
        entry: tuple[_Family, _Series, _Contribution] | None = None
        error = rules.labels_error(labels)
        bounds: tuple[float, ...] = ()
        if error is None and family.kind == rules.HISTOGRAM:
            try:
                bounds = rules.check_buckets(buckets)
            except ValueError as exc:
                error = str(exc)
        key: LabelKey = tuple(sorted(labels.items())) if error is None else ()
        series = family.series.get(key) if error is None else None
        if error is not None:
            self._warn(view, f"a metric of family '{family.name}' is not exported: {error}")
        elif series is not None and series.buckets != bounds:
            self._warn(view, f"histogram '{family.name}' {dict(key)} has buckets {list(series.buckets)} from another "
                             f"model instance, not {list(bounds)}: this instance's observations are not exported")
        elif series is None and self._series >= MAX_SERIES:
            self._warn(view, f"the server exports {MAX_SERIES} custom metrics already: one of '{family.name}' "
                             f"is not exported")
        else:
            if series is None:
                series = family.series[key] = _Series(key, bounds)
                self._series += 1
            contribution = _Contribution(len(bounds))
            if family.kind == rules.GAUGE:
                contribution.incs_at_base = 0.0
            series.contribs[(worker, mid)] = contribution
            entry = (family, series, contribution)
        view.metrics[mid] = entry
        view.family_mids[fid].add(mid)

    def _update(self, view: _Worker, values: list[Any]) -> None:
        entry = view.metrics.get(values[0])
        if entry is None:
            return
        family, series, c = entry
        if family.kind == rules.COUNTER:
            (total,) = values[1:]
            c.total = rules.decode_number(total)
        elif family.kind == rules.GAUGE:
            raw_value, raw_sets, raw_incs, raw_incs_at_set, raw_ns = values[1:]
            set_value = rules.decode_number(raw_value)
            sets = rules.decode_count(raw_sets)
            incs = rules.decode_number(raw_incs)
            incs_at_set = rules.decode_number(raw_incs_at_set)
            set_ns = rules.decode_count(raw_ns)
            if sets != c.sets and set_ns >= series.base_ns:
                # the latest set() of all: it replaces what every holder reported so far (their later
                # increments count again), this worker's increments after it count too
                series.base = set_value
                series.base_ns = set_ns
                for other in series.contribs.values():
                    other.incs_at_base = other.incs
                c.incs_at_base = incs_at_set
            c.sets = sets
            c.incs = incs
        else:
            total, *counts = values[1:]
            if len(counts) != len(c.counts):
                raise ValueError(f"histogram '{family.name}' reported {len(counts)} buckets")
            c.sum = rules.decode_number(total)
            c.counts = [rules.decode_count(n) for n in counts]

    def _drop_family(self, worker: str, view: _Worker, fid: Any) -> None:
        if fid not in view.families:
            return
        for mid in view.family_mids.pop(fid, ()):
            self._drop_metric(worker, view, mid)
        family = view.families.pop(fid)
        if family is not None:
            family.holders -= 1
            if family.holders <= 0 and self._families.get(family.name) is family:
                del self._families[family.name]

    def _drop_metric(self, worker: str, view: _Worker, mid: int) -> None:
        entry = view.metrics.pop(mid, None)
        for mids in view.family_mids.values():
            mids.discard(mid)
        if entry is None:
            return
        family, series, c = entry
        del series.contribs[(worker, mid)]
        if not series.contribs:
            if family.series.get(series.labels) is series:
                del family.series[series.labels]
                self._series -= 1
            return
        # what it counted stays in the metric the other holders keep
        series.retired += c.total
        series.base += c.incs - c.incs_at_base
        for i, n in enumerate(c.counts):
            series.retired_counts[i] += n
        series.retired_sum += c.sum

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of each counter or gauge of family `name`, in label order ([]: no such family).
        What the load reports (orca.py) read."""
        family = self._families.get(name)
        if family is None or family.kind == rules.HISTOGRAM:
            return []
        counter = family.kind == rules.COUNTER
        return [(dict(key), family.series[key].counter_value() if counter else family.series[key].gauge_value())
                for key in sorted(family.series)]

    # ---- rendering ----
    def render_lines(self) -> list[str]:
        """The families' lines in Prometheus text format (Triton's layout: a histogram's _count, _sum, then
        _bucket lines with `le` last); families without metrics are left out."""
        lines: list[str] = []
        for family in self._families.values():
            if not family.series:
                continue
            name = family.name
            lines.append(f"# HELP {name} {_escape_help(family.help)}")
            lines.append(f"# TYPE {name} {rules.KIND_NAMES[family.kind]}")
            for key in sorted(family.series):
                series = family.series[key]
                labels = _labels(key)
                if family.kind == rules.HISTOGRAM:
                    counts, total = series.histogram()
                    lines.append(f"{name}_count{_braces(labels)} {sum(counts)}")
                    lines.append(f"{name}_sum{_braces(labels)} {format_value(total)}")
                    running = 0
                    head = labels + "," if labels else ""
                    for bound, n in zip([*series.buckets, float("inf")], counts, strict=True):
                        running += n
                        lines.append(f'{name}_bucket{{{head}le="{format_value(bound)}"}} {running}')
                else:
                    value = series.counter_value() if family.kind == rules.COUNTER else series.gauge_value()
                    lines.append(f"{name}{_braces(labels)} {format_value(value)}")
        return lines

    def render(self) -> bytes:
        lines = self.render_lines()
        return ("\n".join(lines) + "\n").encode() if lines else b""


def format_value(value: float) -> str:
    """A sample value as Triton's prometheus-cpp writes it: %.16g, with Nan, +Inf and -Inf."""
    if value != value:
        return "Nan"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return "%.16g" % value


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    # the text format escapes backslash and newline in HELP (Triton 2.51 writes them raw, breaking the line)
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(key: LabelKey) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in key)


def _braces(labels: str) -> str:
    return "{" + labels + "}" if labels else ""
