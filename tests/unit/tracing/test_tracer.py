"""The Tracer's sampling (rate, count), its flag for the hot path, and traces refused before queueing."""

from __future__ import annotations

import json

from inferd.supervisor.inference.types import InferRequest
from inferd.supervisor.tracing import live
from inferd.supervisor.tracing.options import TraceOptions
from inferd.supervisor.tracing.record import UNTRACED
from inferd.supervisor.tracing.tracer import Tracer


def _tracer(tmp_path, **kw) -> Tracer:
    return Tracer(TraceOptions(level=("TIMESTAMPS",), file=str(tmp_path / "t.json"), **kw))


def test_rate_count_and_the_flag(tmp_path):
    tracer = _tracer(tmp_path, rate=3, count=2)
    assert live.armed
    traced = [tracer.begin("m", "1", InferRequest("m", id=str(i))) for i in range(12)]
    assert traced == [i % 3 == 2 and i < 6 for i in range(12)]  # every 3rd, 2 in all
    assert tracer.settings.get()["trace_count"] == "0"
    assert live.armed  # two traces are still in flight
    tracer.close()
    assert not live.armed


def test_a_refused_request_ends_its_trace_and_disarms(tmp_path):
    tracer = _tracer(tmp_path, rate=1, count=1)
    request = InferRequest("m", id="r1")
    assert tracer.begin("m", "1", request) and live.armed
    assert tracer.trace_of(str(request.trace.id)) is request.trace
    tracer.abandon(request)
    assert not live.armed  # count used up and nothing in flight: the hot path is back to one check
    assert tracer.trace_of(str(request.trace.id)) is UNTRACED and tracer.trace_of("x" * 30) is UNTRACED
    tracer.close()
    (head, *stamps) = json.loads((tmp_path / "t.json").read_text())
    assert head["request_id"] == "r1" and [s["timestamps"][0]["name"] for s in stamps] == [
        "REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]


def test_children_follow_their_parent_whatever_the_rate(tmp_path):
    tracer = _tracer(tmp_path, rate=1000)
    parent = InferRequest("ens", id="p")
    parent.trace_parent = None
    assert not tracer.begin("ens", "1", parent)  # the 1st of every 1000: not sampled
    step = InferRequest("m", trace_parent=UNTRACED)
    assert not tracer.begin("m", "1", step)  # a step of an untraced ensemble is not sampled on its own
    for _ in range(998):
        tracer.begin("ens", "1", InferRequest("ens"))
    root = InferRequest("ens", id="root")
    assert tracer.begin("ens", "1", root)
    child = InferRequest("m", trace_parent=root.trace)
    assert tracer.begin("m", "1", child) and child.trace.parent is root.trace
    tracer.close()
