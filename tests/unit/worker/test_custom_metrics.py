"""Custom metrics in the worker: pb_utils.MetricFamily / Metric, the registry's reports, the wire message and
the heartbeat thread that sends them."""

from __future__ import annotations

import gc
import math
import os
import tempfile
import threading
import time

import pytest
import zmq
from inferd.worker import metric_registry as cm
from inferd.worker.channel import HeartbeatThread
from inferd.worker.compat import load_pb_utils
from inferd.worker.metrics_sender import MetricsSender
from inferd.worker.wire import messages as m
from inferd.worker.wire import metric_rules as rules

pb = load_pb_utils()
C, G, H = pb.MetricFamily.COUNTER, pb.MetricFamily.GAUGE, pb.MetricFamily.HISTOGRAM


@pytest.fixture(autouse=True)
def _fresh_registry():
    cm.REGISTRY.clear()
    cm.REGISTRY.instance = "m_0"
    yield
    cm.REGISTRY.clear()


def _raises(call, text: str, exc: type[BaseException] = pb.TritonModelException) -> str:
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value), str(info.value)
    return str(info.value)


def test_kinds_are_triton_numbers():
    assert (C, G, H) == (0, 1, 2)


def test_counter_gauge_histogram_values():
    cfam = pb.MetricFamily("reqs", "requests", C)  # a metric lives as long as its family object
    counter = cfam.Metric(labels={"a": "b"})
    counter.increment(2)
    counter.increment(0.5)
    assert counter.value() == 2.5
    family = pb.MetricFamily("g", "a gauge", G)
    gauge = family.Metric()
    gauge.set(5)
    gauge.increment(-7)
    assert gauge.value() == -2
    hfam = pb.MetricFamily("h", "", H)
    hist = hfam.Metric(labels={}, buckets=[1, 2.5])
    for v in (0.5, 1, 2, 3, float("nan")):
        hist.observe(v)
    state = hist._state
    assert state.counts == [2, 1, 2]  # le: 1.0 counts in the first bucket; NaN lands in +Inf
    assert math.isnan(state.sum)


def test_operation_errors_name_triton_kinds():
    families = [pb.MetricFamily("reqs", "d", C), pb.MetricFamily("g", "d", G), pb.MetricFamily("h", "d", H)]
    counter, gauge, hist = families[0].Metric(), families[1].Metric(), families[2].Metric(buckets=[1.0])
    _raises(lambda: counter.increment(-1), "Failed to increment metric value: Failed to process the request for model "
            "'m_0', message: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically")
    _raises(lambda: counter.set(1), "Failed to set metric value: Failed to process the request for model 'm_0', "
            "message: TRITONSERVER_METRIC_KIND_COUNTER does not support Set")
    _raises(lambda: counter.observe(1), "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")
    _raises(lambda: gauge.observe(1), "Failed to observe metric value: ")
    _raises(lambda: hist.increment(1), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
    _raises(lambda: hist.value(), "Failed to get metric value: ")
    _raises(lambda: counter.increment("1"), "a number is required", TypeError)
    _raises(lambda: gauge.set(None), "a number is required", TypeError)
    assert counter.value() == 0


def test_family_and_metric_creation_errors():
    _raises(lambda: pb.MetricFamily("bad-name", "d", C), "Error when creating MetricFamily: Invalid metric name")
    _raises(lambda: pb.MetricFamily("", "d", C), "Invalid metric name")
    _raises(lambda: pb.MetricFamily("__x", "d", C), "Invalid metric name")
    _raises(lambda: pb.MetricFamily("ünï", "d", C), "Invalid metric name")
    _raises(lambda: pb.MetricFamily("x" * 201, "d", C), "longer than 200")
    _raises(lambda: pb.MetricFamily("nv_inference_count", "d", C), "reserved for the server's own metrics")
    _raises(lambda: pb.MetricFamily("inferd_mine", "d", G), "reserved")
    _raises(lambda: pb.MetricFamily(5, "d", C), "the name must be a string")
    _raises(lambda: pb.MetricFamily("x", "d", 7), "kind must be", TypeError)
    assert pb.MetricFamily("ok:colon_1", "d", C).name == "ok:colon_1"
    assert pb.MetricFamily("nv_my_own", "d", C)  # other nv_ names are the model's, as in Triton

    fam = pb.MetricFamily("reqs", "d", C)
    hist = pb.MetricFamily("h", "d", H)
    _raises(lambda: fam.Metric(labels=["x"]), "Failed to create metric. Labels must be a dictionary.")
    _raises(lambda: fam.Metric(buckets=[1.0]), "Failed to create metric. Unexpected buckets found.")
    _raises(lambda: fam.Metric(buckets=[]), "Unexpected buckets found.")
    _raises(lambda: hist.Metric(), "Failed to create metric. Missing required buckets.")
    _raises(lambda: hist.Metric(buckets=(x for x in [1])), "Buckets must be a list.")
    _raises(lambda: hist.Metric(buckets=[2, 1]), "Bucket Boundaries must be strictly sorted")
    _raises(lambda: hist.Metric(buckets=[1, 1]), "Bucket Boundaries must be strictly sorted")
    _raises(lambda: hist.Metric(buckets=[1, float("nan")]), "finite")
    _raises(lambda: hist.Metric(buckets=["1"]), "numbers")
    for bad in ("bad-label", "__reserved", "1x", "", "a:b", "ünï"):
        _raises(lambda bad=bad: fam.Metric(labels={bad: "v"}), "Error when creating Metric: Invalid label name")
    _raises(lambda: fam.Metric(labels={"x": 1}), "the value of label 'x' must be a string")
    _raises(lambda: fam.Metric(labels={"x": "v" * 1025}), "longer than 1024")
    _raises(lambda: fam.Metric(labels={"l%d" % i: "" for i in range(33)}), "more than 32 labels")
    assert fam.Metric(labels={"le": "v", "_x": ""})  # allowed, as in Triton
    assert hist.Metric(labels={"a": "b"}, buckets=[1, 2, float("inf")])._state.buckets == (1.0, 2.0)


def test_a_finalizer_inside_a_locked_section_does_not_deadlock():
    """The garbage collector may run a MetricFamily's finalizer inside any of the registry's locked
    sections, on the thread that holds the lock; the drop then waits for the next operation."""
    family = pb.MetricFamily("collected", "d", C)
    metric = family.Metric(labels={"a": "b"})
    registry = cm.REGISTRY
    fid = family._state.fid
    done = threading.Event()

    def finalizer_under_the_lock():
        with registry._lock:  # as when an allocation in a locked section sets off the collector
            registry.drop_family(fid)
        done.set()

    thread = threading.Thread(target=finalizer_under_the_lock, daemon=True)
    thread.start()
    assert done.wait(10.0), "drop_family deadlocked inside a locked section"
    _raises(lambda: metric.increment(1), "Failed to increment metric value: " + cm.FAMILY_DELETED)
    assert pb.MetricFamily("collected", "d", G)  # the name is free: the family was dropped


def test_one_name_one_kind_per_worker():
    keep = pb.MetricFamily("same", "first", C)
    again = pb.MetricFamily("same", "second description", C)  # allowed: the same family in Triton
    _raises(lambda: pb.MetricFamily("same", "d", G), "already exists as a counter, not a gauge")
    del keep, again
    gc.collect()
    assert pb.MetricFamily("same", "d", G)  # the name is free again once both are gone


def test_same_labels_share_one_metric():
    fam = pb.MetricFamily("reqs", "d", C)
    a = fam.Metric(labels={"x": "1", "y": "2"})
    b = fam.Metric(labels={"y": "2", "x": "1"})
    a.increment(1)
    b.increment(2)
    assert a.value() == b.value() == 3
    assert a._state is b._state
    hist = pb.MetricFamily("h", "d", H)
    first = hist.Metric(buckets=[1.0])
    assert hist.Metric(buckets=[5.0, 10.0])._state is first._state  # its first buckets stay, as in prometheus-cpp


def test_metrics_go_with_their_family_object():
    fam = pb.MetricFamily("reqs", "d", C)
    metric = fam.Metric()
    metric.increment(1)
    assert cm.REGISTRY.report().families
    del fam
    gc.collect()
    deleted = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted"
    _raises(lambda: metric.increment(1), "Failed to increment metric value: " + deleted)
    _raises(lambda: metric.value(), "Failed to get metric value: " + deleted)
    report = cm.REGISTRY.report()
    assert report.dropped == [metric._state.family.fid] and not report.values
    # a temporary family dies at once (Triton: `MetricFamily(...).Metric()` fails on first use)
    orphan = pb.MetricFamily("temp", "d", G).Metric()
    gc.collect()
    _raises(lambda: orphan.set(1), deleted)


def test_bounds_on_families_and_metrics():
    keep = [pb.MetricFamily("f%d" % i, "d", C) for i in range(rules.MAX_FAMILIES)]
    _raises(lambda: pb.MetricFamily("one_more", "d", C), "at most %d metric families" % rules.MAX_FAMILIES)
    fam = keep[0]
    for i in range(rules.MAX_METRICS):
        fam.Metric(labels={"i": str(i)})
    fam.Metric(labels={"i": "0"})  # an existing label set costs nothing
    _raises(lambda: keep[1].Metric(labels={"i": "x"}), "at most %d metrics" % rules.MAX_METRICS)
    del keep[1:]
    gc.collect()
    _raises(lambda: keep[0].Metric(labels={"i": "y"}), "at most")  # its own metrics still count
    keep.clear()
    del fam
    gc.collect()
    assert pb.MetricFamily("fresh", "d", C).Metric(labels={"i": "y"})


def test_reports_carry_changes_then_nothing():
    reg = cm.REGISTRY
    reg.source = "model 'm' instance 'm_0'"
    assert reg.report() is None
    fam = pb.MetricFamily("reqs", "Requests", C)
    counter = fam.Metric(labels={"a": "b"})
    gfam = pb.MetricFamily("g", "Gauge", G)
    gauge = gfam.Metric()
    counter.increment(3)
    gauge.set(float("nan"))
    gauge.increment(2)
    report = reg.report()
    fid, gid = fam._state.fid, gfam._state.fid
    cid, mid = counter._state.mid, gauge._state.mid
    assert not report.full and report.source == "model 'm' instance 'm_0'"
    assert report.families == [[fid, "reqs", "Requests", C], [gid, "g", "Gauge", G]]
    assert report.metrics == [[cid, fid, {"a": "b"}, None], [mid, gid, {}, None]]
    assert report.values[0] == [cid, 3.0]
    assert report.values[1][:5] == [mid, "NaN", 1, 2.0, 0.0] and report.values[1][5] > 0
    assert reg.report() is None  # nothing changed since
    counter.increment(1)
    report = reg.report()
    assert (report.families, report.metrics, report.values, report.source) == ([], [], [[cid, 4.0]], "")
    reg.resend_all()  # a report was lost: the next one holds everything
    report = reg.report()
    assert report.full and len(report.families) == 2 and len(report.metrics) == 2 and len(report.values) == 2
    assert report.source


def test_family_made_and_dropped_between_reports_is_never_mentioned():
    fam = pb.MetricFamily("brief", "d", C)
    fam.Metric().increment(1)
    del fam
    gc.collect()
    assert cm.REGISTRY.report() is None


def test_report_survives_the_wire():
    fam = pb.MetricFamily("h", 'quote " and \\ and \n', H)
    metric = fam.Metric(labels={"k": 'v"\n'}, buckets=[0.1, 1e21])
    metric.observe(float("inf"))
    report = cm.REGISTRY.report()
    frames = m.encode(report)
    back, data = m.decode(frames)
    assert back == report and not data
    assert back.values == [[metric._state.mid, "+Inf", 0, 0, 1]]
    assert rules.decode_number("+Inf") == math.inf and math.isnan(rules.decode_number("NaN"))
    with pytest.raises(ValueError):
        rules.decode_number("1.5")
    with pytest.raises(m.ProtocolError):
        m.decode([b'{"t":"metrics_report","bogus":1}'])


def test_threads_update_one_metric():
    fam = pb.MetricFamily("reqs", "d", C)
    metric = fam.Metric()

    def work() -> None:
        for _ in range(2000):
            metric.increment(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert metric.value() == 8000


def test_heartbeat_thread_sends_reports_on_the_metrics_socket():
    ctx = zmq.Context()
    path = os.path.join(tempfile.mkdtemp(), "s.sock")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("ipc://" + path)
    lost = []
    sender = MetricsSender(ctx, "ipc://" + path, "w7", cm.REGISTRY)
    thread = HeartbeatThread(ctx, "ipc://" + path, "w7", 0.02, 0.0, lost.append, metrics=sender)
    try:
        thread.start()
        seen: dict[bytes, list] = {}

        def take(timeout_ms: int = 5000) -> None:
            # the thread answers heartbeats only (and reports metrics after each answer): ping it, once
            # its socket is connected (ROUTER_MANDATORY refuses a send to an identity not connected yet)
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                try:
                    router.send_multipart([b"w7/hb", *m.encode(m.Heartbeat(len(seen.get(b"w7/hb", []))))])
                    break
                except zmq.ZMQError:
                    assert time.monotonic() < deadline, "the heartbeat socket never connected"
                    router.poll(20)
            assert router.poll(timeout_ms), "nothing received"
            ident, *frames = router.recv_multipart()
            seen.setdefault(ident, []).append(m.decode(frames)[0])

        for _ in range(5):
            take()
        assert set(seen) == {b"w7/hb"}  # no metrics, no metrics socket
        fam = pb.MetricFamily("reqs", "d", C)
        fam.Metric().increment(2)
        while b"w7/metrics" not in seen:
            take()
        report = seen[b"w7/metrics"][0]
        assert isinstance(report, m.MetricsReport) and report.values[0][1] == 2.0
    finally:
        thread.stop()
        thread.join(2)
        router.close(0)
        ctx.term()
    assert not lost
