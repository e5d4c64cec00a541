"""render_metrics: Triton's names and labels, valid exposition text, agreement with the stats JSON."""

from __future__ import annotations

import re

from inferd.supervisor.metrics.endpoint import ExtraMetrics, render_metrics
from inferd.supervisor.metrics.model_statistics import StatsRegistry
from inferd.supervisor.metrics.server_families import InstanceMetrics
from prometheus_client.parser import text_string_to_metric_families

COUNTERS_US = {
    "nv_inference_request_duration_us": "success",
    "nv_inference_queue_duration_us": "queue",
    "nv_inference_compute_input_duration_us": "compute_input",
    "nv_inference_compute_infer_duration_us": "compute_infer",
    "nv_inference_compute_output_duration_us": "compute_output",
}


def _families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def _value(fam, **labels) -> float:
    hits = [s.value for s in fam.samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (fam.name, labels, fam.samples)
    return hits[0]


def _busy_registry() -> StatsRegistry:
    reg = StatsRegistry()
    a = reg.get("alpha", 1)
    for i in range(7):
        a.record_execution(2, 1_234, 56_789_123, 9_999)
        a.record_success(2, 60_001_999 + i, 1_999, 1_234, 56_789_123, 9_999)
    a.record_failure("CANCELED", 5_000)
    a.record_failure("REJECTED", 0)
    a.load_duration_s = 1.25
    reg.get("alpha", 2).record_failure("BACKEND", 10)
    reg.get("beta", 1)
    return reg


def test_counters_agree_with_the_statistics_json() -> None:
    reg = _busy_registry()
    fams = _families(render_metrics(reg, system=False))
    for entry in reg.to_json()["model_stats"]:
        lab = {"model": entry["name"], "version": entry["version"]}
        st = entry["inference_stats"]
        assert _value(fams["nv_inference_request_success"], **lab) == st["success"]["count"]
        assert _value(fams["nv_inference_count"], **lab) == entry["inference_count"]
        assert _value(fams["nv_inference_exec_count"], **lab) == entry["execution_count"]
        for name, key in COUNTERS_US.items():
            assert _value(fams[name], **lab) == st[key]["ns"] // 1000, name
        failures = sum(_value(fams["nv_inference_request_failure"], reason=r, **lab)
                       for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER"))
        assert failures == st["fail"]["count"]
    alpha1 = {"model": "alpha", "version": "1"}
    assert _value(fams["nv_inference_request_failure"], reason="CANCELED", **alpha1) == 1
    assert _value(fams["nv_model_load_duration_secs"], **alpha1) == 1.25
    assert fams["nv_inference_request_success"].type == "counter"
    assert fams["nv_inference_pending_request_count"].type == "gauge"
    assert fams["nv_model_load_duration_secs"].type == "gauge"


def test_exact_triton_names_and_sorted_labels_in_the_text() -> None:
    text = render_metrics(_busy_registry(), system=False).decode()
    assert 'nv_inference_request_success{model="alpha",version="1"} 7\n' in text
    assert 'nv_inference_request_failure{model="alpha",reason="BACKEND",version="2"} 1\n' in text
    assert "# TYPE nv_inference_count counter\n" in text
    assert "_total" not in "".join(line for line in text.splitlines() if line.startswith("nv_"))
    # every family: one HELP, one TYPE, then its samples; nothing but comments and samples
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.e+-]+$')
    seen: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            seen.append(line.split()[2])
        elif line.startswith("# TYPE "):
            assert line.split()[2] == seen[-1]
        else:
            assert sample.match(line), line
            assert line.startswith(seen[-1])
    assert len(seen) == len(set(seen))
    assert text.endswith("\n")


def test_pending_instances_and_shm_from_the_callback() -> None:
    reg = _busy_registry()
    calls = []

    def extra() -> ExtraMetrics:
        calls.append(1)
        return ExtraMetrics(
            pending={("alpha", "1"): 4},
            instances=[InstanceMetrics("alpha", "1", "alpha_1", "failed", restarts=3, inflight=0,
                                       restart_reasons={"memory": 2, "hung": 1}),
                       InstanceMetrics("alpha", "1", "alpha_0", "ready", restarts=0, inflight=2),
                       InstanceMetrics("beta", "1", "beta_0", "weird")],
            shm_bytes_in_use=4096,
            shm_bytes_reserved=1 << 20,
        )

    fams = _families(render_metrics(reg, extra, system=False))
    assert len(calls) == 1
    assert _value(fams["nv_inference_pending_request_count"], model="alpha", version="1") == 4
    assert _value(fams["nv_inference_pending_request_count"], model="beta", version="1") == 0
    restarts = fams["inferd_instance_restarts"]
    assert restarts.type == "counter"
    assert _value(restarts, instance="alpha_1", reason="memory") == 2
    assert _value(restarts, instance="alpha_1", reason="hung") == 1
    assert {s.labels["reason"] for s in restarts.samples if s.labels["instance"] == "alpha_0"} == {
        "exit", "signal", "hung", "memory", "recycled"}  # every reason has a series: sum() is the total
    assert _value(fams["inferd_instance_inflight_requests"], instance="alpha_0") == 2
    state = fams["inferd_instance_state"]
    assert _value(state, instance="alpha_0", state="ready") == 1
    assert _value(state, instance="alpha_0", state="failed") == 0
    assert _value(state, instance="alpha_1", state="failed") == 1
    assert _value(state, instance="beta_0", state="weird") == 1
    assert sum(s.value for s in state.samples if s.labels["instance"] == "alpha_0") == 1
    assert _value(fams["inferd_shm_bytes_in_use"]) == 4096
    assert _value(fams["inferd_shm_bytes_reserved"]) == 1 << 20
    assert _value(fams["inferd_inference_request_items"], model="alpha", version="1") == 14


def test_system_metrics_from_psutil() -> None:
    reg = StatsRegistry()
    render_metrics(reg)  # primes the CPU sampler
    fams = _families(render_metrics(reg))
    util = _value(fams["nv_cpu_utilization"])
    total = _value(fams["nv_cpu_memory_total_bytes"])
    used = _value(fams["nv_cpu_memory_used_bytes"])
    assert 0.0 <= util <= 1.0
    assert 0 < used <= total
    assert "nv_inference_request_success" not in fams  # no model loaded: no per-model families


def test_label_values_are_escaped() -> None:
    reg = StatsRegistry()
    odd = 'we"ird\\name\nx'
    reg.get(odd, 1).record_success(1, 3000, 0, 0, 0, 0)
    fams = _families(render_metrics(reg, system=False))
    assert _value(fams["nv_inference_request_success"], model=odd, version="1") == 1
    assert _value(fams["nv_inference_request_duration_us"], model=odd) == 3


def test_cache_families_only_for_models_with_the_cache_on() -> None:
    reg = StatsRegistry()
    reg.get("plain", 1).record_cache_miss(1)
    cached = reg.get("cached", 1)
    cached.cache_enabled = True
    cached.record_cache_hit(2_500, request_ns=9_000, queue_ns=1_000)
    cached.record_cache_miss(7_000)
    fams = _families(render_metrics(reg, system=False))
    hits = fams["nv_cache_num_hits_per_model"]
    assert [s.labels["model"] for s in hits.samples] == ["cached"]
    assert _value(hits, model="cached") == 1
    assert _value(fams["nv_cache_num_misses_per_model"], model="cached") == 1
    assert _value(fams["nv_cache_hit_duration_per_model"], model="cached") == 2
    assert _value(fams["nv_cache_miss_duration_per_model"], model="cached") == 7
    assert _value(fams["nv_inference_request_success"], model="cached") == 1
    assert _value(fams["nv_inference_count"], model="cached") == 0


def test_scrape_is_cheap_for_many_models() -> None:
    import time

    reg = StatsRegistry()
    for m in range(100):
        s = reg.get(f"model_{m}", 1)
        s.record_execution(4, 1, 2, 3)
        s.record_success(4, 10, 1, 1, 2, 3)
    render_metrics(reg, system=False)
    start = time.perf_counter()
    for _ in range(10):
        render_metrics(reg, system=False)
    assert (time.perf_counter() - start) / 10 < 0.05  # ~1 ms here; generous for slow CI machines
