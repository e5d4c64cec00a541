"""Custom metrics in the supervisor: merging the workers' reports as Triton's one registry does, removal,
what a worker may not do, the exposition lines."""

from __future__ import annotations

import logging

from inferd.supervisor.metrics.custom import MAX_SERIES, CustomMetrics, format_value
from inferd.worker.wire import metric_rules as rules
from inferd.worker.wire.messages import MetricsReport
from prometheus_client.parser import text_string_to_metric_families

C, G, H = rules.COUNTER, rules.GAUGE, rules.HISTOGRAM


def _report(**kw) -> MetricsReport:
    return MetricsReport(**kw)


def _define(reg: CustomMetrics, worker: str, *, full: bool = False) -> None:
    """Families 1 (counter), 2 (gauge), 3 (histogram) with one metric each (ids 10, 20, 30)."""
    reg.apply(worker, _report(full=full, source=f"model 'm' instance '{worker}'", families=[
        [1, "reqs", "Requests", C], [2, "temp", "Temperature", G], [3, "lat", "Latency", H]], metrics=[
        [10, 1, {"b": "2", "a": "1"}, None], [20, 2, {}, None], [30, 3, {"k": "v"}, [1.0, 2.5, 5.0]]]))


def _gauge(mid: int, set_value: float, sets: int, incs: float, incs_at_set: float, set_ns: int) -> list:
    return [mid, set_value, sets, incs, incs_at_set, set_ns]


def _lines(reg: CustomMetrics) -> list[str]:
    return reg.render_lines()


def test_one_worker_renders_triton_lines():
    reg = CustomMetrics()
    _define(reg, "w1")
    reg.apply("w1", _report(values=[[10, 5.0], _gauge(20, 2.5, 1, -4.0, 0.0, 100), [30, 106.0, 1, 1, 1, 1]]))
    assert _lines(reg) == [
        "# HELP reqs Requests", "# TYPE reqs counter", 'reqs{a="1",b="2"} 5',
        "# HELP temp Temperature", "# TYPE temp gauge", "temp -1.5",
        "# HELP lat Latency", "# TYPE lat histogram",
        'lat_count{k="v"} 4', 'lat_sum{k="v"} 106',
        'lat_bucket{k="v",le="1"} 1', 'lat_bucket{k="v",le="2.5"} 2', 'lat_bucket{k="v",le="5"} 3',
        'lat_bucket{k="v",le="+Inf"} 4',
    ]
    parsed = {f.name: f for f in text_string_to_metric_families(reg.render().decode())}
    assert parsed["lat"].type == "histogram" and parsed["reqs"].type == "counter"


def test_values_are_written_as_triton_writes_them():
    cases = {float("nan"): "Nan", 0.1 + 0.2: "0.3", 1e21: "1e+21", 1e16: "1e+16", 123456789.123: "123456789.123",
             1 / 3: "0.3333333333333333", -0.0: "-0", 1e-7: "1e-07", 5.0: "5", 1e15 + 0.5: "1000000000000000",
             float("-inf"): "-Inf", float("inf"): "+Inf", 12345678901234567890.0: "1.234567890123457e+19"}
    for value, text in cases.items():
        assert format_value(value) == text


def test_two_instances_share_one_metric():
    reg = CustomMetrics()
    _define(reg, "w1")
    _define(reg, "w2")
    reg.apply("w1", _report(values=[[10, 2.0], [30, 3.0, 1, 1, 0, 0]]))
    reg.apply("w2", _report(values=[[10, 3.0], [30, 100.0, 0, 0, 0, 1]]))
    lines = _lines(reg)
    assert 'reqs{a="1",b="2"} 5' in lines
    assert 'lat_count{k="v"} 3' in lines and 'lat_sum{k="v"} 103' in lines
    assert 'lat_bucket{k="v",le="2.5"} 2' in lines and 'lat_bucket{k="v",le="+Inf"} 3' in lines
    # later cumulative reports replace the earlier ones (a lost report costs nothing)
    reg.apply("w1", _report(values=[[10, 4.0]]))
    assert 'reqs{a="1",b="2"} 7' in _lines(reg)


def test_gauge_takes_the_latest_set_then_every_increment():
    reg = CustomMetrics()
    _define(reg, "w1")
    _define(reg, "w2")
    reg.apply("w2", _report(values=[_gauge(20, 7.0, 1, 0.0, 0.0, 2_000)]))  # w2 set 7 at t=2000
    reg.apply("w1", _report(values=[_gauge(20, 3.0, 1, 0.0, 0.0, 1_000)]))  # w1 set 3 earlier: superseded
    assert "temp 7" in _lines(reg)
    reg.apply("w1", _report(values=[_gauge(20, 3.0, 1, 2.0, 0.0, 1_000)]))  # then w1 adds 2
    assert "temp 9" in _lines(reg)
    reg.apply("w1", _report(values=[_gauge(20, 10.0, 2, 3.0, 2.0, 3_000)]))  # w1 sets 10, then adds 1
    assert "temp 11" in _lines(reg)
    reg.apply("w2", _report(values=[_gauge(20, 7.0, 1, -1.0, 0.0, 2_000)]))  # w2 subtracts 1
    assert "temp 10" in _lines(reg)


def test_increment_only_gauge_adds_up_across_instances():
    reg = CustomMetrics()
    _define(reg, "w1")
    _define(reg, "w2")
    reg.apply("w1", _report(values=[_gauge(20, 0.0, 0, 3.0, 0.0, 0)]))
    reg.apply("w2", _report(values=[_gauge(20, 0.0, 0, -1.0, 0.0, 0)]))
    assert "temp 2" in _lines(reg)
    reg.forget("w2")  # what a departing worker counted stays in the metric w1 still holds
    assert "temp 2" in _lines(reg)


def test_a_departing_worker_leaves_its_counts_to_the_holders():
    reg = CustomMetrics()
    _define(reg, "w1")
    _define(reg, "w2")
    reg.apply("w1", _report(values=[[10, 2.0], [30, 1.0, 1, 0, 0, 0]]))
    reg.apply("w2", _report(values=[[10, 3.0], [30, 9.0, 0, 0, 0, 1]]))
    reg.forget("w2")
    lines = _lines(reg)
    assert 'reqs{a="1",b="2"} 5' in lines and 'lat_count{k="v"} 2' in lines and 'lat_sum{k="v"} 10' in lines
    reg.forget("w1")  # the last holder: the metrics and families are gone
    assert _lines(reg) == []
    assert reg.render() == b""
    _define(reg, "w3")  # made again: from zero
    assert 'reqs{a="1",b="2"} 0' in _lines(reg)


def test_dropped_family_and_full_report():
    reg = CustomMetrics()
    _define(reg, "w1")
    reg.apply("w1", _report(values=[[10, 1.0]], dropped=[2]))  # the gauge's MetricFamily was collected
    names = [line for line in _lines(reg) if line.startswith("# TYPE")]
    assert names == ["# TYPE reqs counter", "# TYPE lat histogram"]
    # a full report lists everything alive: the histogram family is not listed any more
    reg.apply("w1", _report(full=True, families=[[1, "reqs", "Requests", C]],
                            metrics=[[10, 1, {"b": "2", "a": "1"}, None]], values=[[10, 4.0]]))
    assert _lines(reg) == ["# HELP reqs Requests", "# TYPE reqs counter", 'reqs{a="1",b="2"} 4']


def test_families_without_metrics_are_not_written():
    reg = CustomMetrics()
    reg.apply("w1", _report(families=[[1, "empty", "nothing", C]]))
    assert _lines(reg) == []


def test_first_kind_and_description_win(caplog):
    reg = CustomMetrics()
    _define(reg, "w1")
    with caplog.at_level(logging.WARNING, "inferd.custom_metrics"):
        reg.apply("w2", _report(source="model 'other' instance 'other_0'", families=[
            [1, "reqs", "Another text", G], [2, "temp", "Another text", G]], metrics=[
            [10, 1, {"a": "1", "b": "2"}, None], [20, 2, {"x": "y"}, None]], values=[_gauge(10, 9.0, 1, 0, 0, 5)]))
        reg.apply("w2", _report(values=[_gauge(10, 9.0, 2, 0, 0, 6)]))
    lines = _lines(reg)
    assert 'reqs{a="1",b="2"} 0' in lines and "# HELP temp Temperature" in lines and 'temp{x="y"} 0' in lines
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "model 'other' instance 'other_0'" in warnings[0]
    assert "'reqs' is a gauge here but already exported as a counter" in warnings[0]


def test_histogram_buckets_must_agree(caplog):
    reg = CustomMetrics()
    _define(reg, "w1")
    with caplog.at_level(logging.WARNING, "inferd.custom_metrics"):
        reg.apply("w2", _report(families=[[3, "lat", "Latency", H]], metrics=[[30, 3, {"k": "v"}, [1.0, 10.0]]],
                                values=[[30, 5.0, 0, 1, 0]]))
    assert 'lat_count{k="v"} 0' in _lines(reg)
    assert "has buckets [1.0, 2.5, 5.0] from another model instance" in caplog.text


def test_nothing_a_worker_reports_is_trusted(caplog):
    reg = CustomMetrics()
    with caplog.at_level(logging.WARNING, "inferd.custom_metrics"):
        reg.apply("w1", _report(families=[[1, "bad-name", "d", C], [2, "nv_inference_count", "d", C],
                                          [3, "ok", "d", 9], [4, "fine", "d", C]],
                                metrics=[[10, 1, {}, None], [20, 2, {"model": "m", "version": "1"}, None],
                                         [40, 4, {"bad-label": "v"}, None], [41, 4, {"x": 1}, None],
                                         [42, 99, {}, None], [43, 4, {"ok": "v"}, None]],
                                values=[[20, 100.0], [43, 1.0], [44, 2.0]]))
        reg.apply("w1", _report(values=[[43, "lots"]]))  # malformed: ignored, said once
        reg.apply("w1", _report(values=[[43, "lots"]]))
        reg.apply("w1", _report(families=[["x"]]))
    assert _lines(reg) == ["# HELP fine d", "# TYPE fine counter", 'fine{ok="v"} 1']
    text = caplog.text
    assert "Invalid metric name 'bad-name'" in text and "reserved for the server's own metrics" in text
    assert "unknown metric kind 9" in text and "Invalid label name 'bad-label'" in text
    assert "the value of label 'x' must be a string" in text
    assert text.count("not a number") == 1 and "malformed metrics report" in text


def test_per_worker_and_server_bounds(caplog, monkeypatch):
    reg = CustomMetrics()
    fams = [[i, f"f{i}", "d", C] for i in range(rules.MAX_FAMILIES + 5)]
    mets = [[1000 + i, 0, {"i": str(i)}, None] for i in range(rules.MAX_METRICS + 5)]
    with caplog.at_level(logging.WARNING, "inferd.custom_metrics"):
        reg.apply("w1", _report(families=fams, metrics=mets))
    assert sum(1 for line in _lines(reg) if line.startswith("# TYPE")) == 1  # only f0 has metrics
    assert sum(1 for line in _lines(reg) if line.startswith("f0{")) == rules.MAX_METRICS
    assert f"more than {rules.MAX_FAMILIES} metric families" in caplog.text
    assert f"more than {rules.MAX_METRICS} metrics" in caplog.text
    monkeypatch.setattr("inferd.supervisor.metrics.custom.MAX_SERIES", 3)
    reg2 = CustomMetrics()
    with caplog.at_level(logging.WARNING, "inferd.custom_metrics"):
        reg2.apply("w1", _report(families=[[1, "x", "d", C]], metrics=[[i, 1, {"i": str(i)}, None] for i in range(5)]))
    assert sum(1 for line in _lines(reg2) if line.startswith("x{")) == 3
    assert "the server exports 3 custom metrics already" in caplog.text
    assert MAX_SERIES >= 10_000


def test_help_and_label_values_are_escaped():
    reg = CustomMetrics()
    reg.apply("w1", _report(families=[[1, "esc", 'line\nbreak \\ "q"', G]],
                            metrics=[[10, 1, {"b": 'x"y\\z\nw'}, None]]))
    assert _lines(reg) == ['# HELP esc line\\nbreak \\\\ "q"', "# TYPE esc gauge", 'esc{b="x\\"y\\\\z\\nw"} 0']
    families = list(text_string_to_metric_families(reg.render().decode()))
    assert families[0].samples[0].labels == {"b": 'x"y\\z\nw'}


def test_channel_route_and_departure():
    routes = {}

    class FakeChannel:
        def route_suffix(self, suffix, handler, on_gone):
            routes[suffix] = (handler, on_gone)

    reg = CustomMetrics()
    reg.attach(FakeChannel())
    handler, on_gone = routes["/metrics"]
    from inferd.worker.wire import messages as m

    handler("w1/metrics", m.encode(_report(families=[[1, "c", "d", C]], metrics=[[10, 1, {}, None]],
                                           values=[[10, 2.0]])))
    handler("w1/metrics", [b"not json"])  # a malformed message is dropped (and logged)
    assert "c 2" in _lines(reg)
    on_gone("w1")
    assert _lines(reg) == []
