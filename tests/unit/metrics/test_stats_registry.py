"""StatsRegistry / ModelStats: counting rules and the statistics extension JSON (triton.md §7.2)."""

from __future__ import annotations

import time

import pytest
from inferd.supervisor.metrics.model_statistics import FAILURE_REASONS, StatsRegistry
from inferd.worker.wire.errors import ErrorCode, InferdError

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")


def test_fresh_version_json_shape() -> None:
    reg = StatsRegistry()
    reg.get("m", 1)
    doc = reg.to_json()
    assert doc == {"model_stats": [{
        "name": "m",
        "version": "1",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {k: {"count": 0, "ns": 0} for k in DURATIONS},
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }]}
    assert list(doc["model_stats"][0]["inference_stats"]) == list(DURATIONS)


def test_get_returns_the_same_object_and_version_is_a_string() -> None:
    reg = StatsRegistry()
    a = reg.get("m", 3)
    assert reg.get("m", "3") is a
    assert a.version == "3"
    assert reg.find("m", 3) is a and reg.find("m", 4) is None


def test_requests_and_executions_are_counted_like_triton() -> None:
    reg = StatsRegistry()
    s = reg.get("m", "1")
    before = time.time_ns() // 1_000_000
    # one batch of two requests, then one of a single request
    s.record_execution(2, 100, 2000, 30)
    for _ in range(2):
        s.record_success(1, request_ns=5000, queue_ns=400, compute_input_ns=100,
                         compute_infer_ns=2000, compute_output_ns=30)
    s.record_execution(1, 10, 200, 3)
    s.record_success(1, 600, 40, 10, 200, 3)
    s.record_failure("BACKEND", 700)
    s.record_failure("REJECTED", 50)
    s.record_failure("no such reason", 1)
    e = reg.to_json("m")["model_stats"][0]
    st = e["inference_stats"]
    assert e["inference_count"] == 3 and e["execution_count"] == 2
    assert st["success"] == {"count": 3, "ns": 10600}
    assert st["fail"] == {"count": 3, "ns": 751}
    assert st["queue"] == {"count": 3, "ns": 840}
    assert st["compute_input"] == {"count": 3, "ns": 210}
    assert st["compute_infer"] == {"count": 3, "ns": 4200}
    assert st["compute_output"] == {"count": 3, "ns": 63}
    assert e["batch_stats"] == [
        {"batch_size": 1, "compute_input": {"count": 1, "ns": 10}, "compute_infer": {"count": 1, "ns": 200},
         "compute_output": {"count": 1, "ns": 3}},
        {"batch_size": 2, "compute_input": {"count": 1, "ns": 100},
         "compute_infer": {"count": 1, "ns": 2000}, "compute_output": {"count": 1, "ns": 30}},
    ]
    assert s.fail_by_reason == {"OTHER": 1, "BACKEND": 1, "CANCELED": 0, "REJECTED": 1}
    assert set(s.fail_by_reason) == set(FAILURE_REASONS)
    assert before <= e["last_inference"] <= time.time_ns() // 1_000_000


def test_cache_hits_count_as_success_and_queue_but_not_compute_or_inference() -> None:
    reg = StatsRegistry()
    s = reg.get("m", "1")
    s.record_cache_miss(70)
    s.record_execution(1, 1, 2, 3)
    s.record_success(1, 1000, 10, 1, 2, 3)
    s.record_cache_hit(5, request_ns=100, queue_ns=4)
    e = s.to_json()
    st = e["inference_stats"]
    assert st["success"] == {"count": 2, "ns": 1100}
    assert st["queue"] == {"count": 2, "ns": 14}
    assert st["compute_infer"] == {"count": 1, "ns": 2}
    assert st["cache_hit"] == {"count": 1, "ns": 5}
    assert st["cache_miss"] == {"count": 1, "ns": 70}
    assert e["inference_count"] == 1 and e["execution_count"] == 1
    assert s.success_items == 2


def test_selection_order_and_errors() -> None:
    reg = StatsRegistry()
    for name, version in (("b", "1"), ("a", "10"), ("a", "2"), ("c", "1")):
        reg.get(name, version)
    assert [(e["name"], e["version"]) for e in reg.to_json()["model_stats"]] == [
        ("a", "2"), ("a", "10"), ("b", "1"), ("c", "1")]
    assert [e["version"] for e in reg.to_json("a")["model_stats"]] == ["2", "10"]
    assert [e["version"] for e in reg.to_json("a", 10)["model_stats"]] == ["10"]
    with pytest.raises(InferdError) as err:
        reg.to_json("zzz")
    assert err.value.code == ErrorCode.INVALID_ARG
    assert err.value.message == "requested model 'zzz' is not available"
    with pytest.raises(InferdError) as err:
        reg.to_json("a", "3")
    assert err.value.code == ErrorCode.INVALID_ARG
    assert err.value.message == "requested model version is not available for model 'a'"


def test_remove_forgets_the_version() -> None:
    reg = StatsRegistry()
    reg.get("m", 1).record_success(1, 1, 1, 1, 1, 1)
    reg.get("m", 2)
    reg.remove("m", 1)
    reg.remove("m", 1)  # twice is harmless
    assert [e["version"] for e in reg.to_json()["model_stats"]] == ["2"]
    assert len(reg) == 1
    assert reg.get("m", 1).success_count == 0  # a reload starts from zero, as Triton does


def test_a_batch_of_successes_counts_as_its_requests_one_by_one() -> None:
    reg = StatsRegistry()
    one, batch = reg.get("one", "1"), reg.get("batch", "1")
    arrivals, start, end = [5000, 3000, 9100], 9100, 10000
    for arrival in arrivals:
        one.record_success(1, end - arrival, start - arrival, 100, 2000, 30)
    batch.record_successes(arrivals, start, end, 100, 2000, 30)
    expected = reg.to_json("one")["model_stats"][0]
    got = reg.to_json("batch")["model_stats"][0]
    assert got["inference_stats"] == expected["inference_stats"]
    assert got["last_inference"] >= expected["last_inference"] > 0


def test_a_batch_of_successes_keeps_each_request_for_the_latency_summaries() -> None:
    from inferd.supervisor.metrics import latency_summary as ls

    reg = StatsRegistry(ls.LatencyMetricsConfig(summaries=True))
    s = reg.get("m", "1")
    s.record_successes([5000, 3000], 9000, 10000, 100, 2000, 30)
    assert s.latency is not None
    assert [entry[1:3] for entry in s.latency.entries] == [(5, 4), (7, 6)]
    assert s.success_count == 2 and s.success_ns == 12000 and s.queue_ns == 10000
