"""/metrics against Triton's current metrics.md (issue 43 item 5): every family that applies on CPU, with its
labels, read with prometheus_client's parser. Where Triton 2.51 has the family the test runs against it too
(INFERD_E2E_TARGET=triton); families added later are inferd-only tests that name the Triton release that added
them: nv_model_load_duration_secs and the first-response histogram with model_metrics buckets (2.52, for
decoupled models; for every model since 2.65)."""

from __future__ import annotations

import queue
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

PLAIN, STREAMED, CACHED = "identity_fp32", "decoupled_repeat", "cache_counter"
DEFAULT_PINNED = 268435456  # tritonserver's --pinned-memory-pool-byte-size
HISTOGRAM = "nv_inference_first_response_histogram_ms"
PER_MODEL = {  # Triton 2.51's per-model families of a server without cache, and their labels
    "nv_inference_request_success": ("counter", {"model", "version"}),
    "nv_inference_request_failure": ("counter", {"model", "reason", "version"}),
    "nv_inference_count": ("counter", {"model", "version"}),
    "nv_inference_exec_count": ("counter", {"model", "version"}),
    "nv_inference_request_duration_us": ("counter", {"model", "version"}),
    "nv_inference_queue_duration_us": ("counter", {"model", "version"}),
    "nv_inference_compute_input_duration_us": ("counter", {"model", "version"}),
    "nv_inference_compute_infer_duration_us": ("counter", {"model", "version"}),
    "nv_inference_compute_output_duration_us": ("counter", {"model", "version"}),
    "nv_inference_pending_request_count": ("gauge", {"model", "version"}),
}
SERVER_WIDE = {  # no labels
    "nv_pinned_memory_pool_total_bytes": "gauge", "nv_pinned_memory_pool_used_bytes": "gauge",
    "nv_cpu_utilization": "gauge", "nv_cpu_memory_total_bytes": "gauge", "nv_cpu_memory_used_bytes": "gauge",
}


def families(server) -> dict:
    return {f.name: f for f in text_string_to_metric_families(server.metrics())}


def value(fam, name: str | None = None, **labels: str) -> float:
    hits = [s.value for s in fam.samples if (name is None or s.name == name)
            and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (fam.name, name, labels, fam.samples)
    return hits[0]


def polled(server, check, what: str) -> dict:
    """The families once `check(families)` holds: Triton reads its CPU and pinned memory gauges every
    --metrics-interval-ms / 2 (0 or no sample before the first reading); inferd when scraped."""
    return server.wait_until(lambda: (lambda f: f if check(f) else None)(families(server)), 20, what)


def infer_plain(server, n: int, model: str = PLAIN) -> None:
    client = server.http_client()
    try:
        for _ in range(n):
            x = httpclient.InferInput("INPUT0", [4], "FP32")
            x.set_data_from_numpy(np.ones(4, np.float32))
            client.infer(model, [x])
    finally:
        client.close()


def stream(server, counts: tuple[int, ...]) -> None:
    """One decoupled_repeat request per count (it answers `count` responses, then an empty final one)."""
    client = server.grpc_client()
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for n in counts:
            x = grpcclient.InferInput("IN", [1], "INT32")
            x.set_data_from_numpy(np.array([n], np.int32))
            client.async_stream_infer(STREAMED, [x], enable_empty_final_response=True)
        finals = 0
        while finals < len(counts):
            result, error = results.get(timeout=30)
            assert error is None, error
            params = result.get_response(as_json=True).get("parameters", {})
            finals += bool(params.get("triton_final_response", {}).get("bool_param"))
    finally:
        client.stop_stream()
        client.close()


def test_every_cpu_family_with_its_labels(server_factory, harness):
    server = server_factory([PLAIN, STREAMED])
    infer_plain(server, 2)
    stream(server, (2,))
    fams = polled(server, lambda f: f.get("nv_cpu_memory_total_bytes") and f["nv_cpu_memory_total_bytes"].samples
                  and value(f["nv_pinned_memory_pool_total_bytes"]) > 0, "the CPU and pinned memory gauges")
    expected = set(PER_MODEL) | set(SERVER_WIDE)
    if not harness.target_is_triton():
        expected.add("nv_model_load_duration_secs")  # Triton 2.52 added it
    assert {name for name in fams if name.startswith("nv_")} == expected
    for name, (kind, labels) in PER_MODEL.items():
        fam = fams[name]
        assert fam.type == kind, name
        assert {s.labels["model"] for s in fam.samples} == {PLAIN, STREAMED}, name
        assert all(set(s.labels) == labels for s in fam.samples), (name, fam.samples)
    reasons = {s.labels["reason"] for s in fams["nv_inference_request_failure"].samples}
    assert reasons == {"OTHER", "BACKEND", "CANCELED", "REJECTED"}
    assert value(fams["nv_inference_request_success"], model=PLAIN, version="1") == 2
    assert value(fams["nv_inference_request_success"], model=STREAMED, version="1") == 1
    assert value(fams["nv_inference_pending_request_count"], model=PLAIN, version="1") == 0
    for name, kind in SERVER_WIDE.items():
        assert fams[name].type == kind and [s.labels for s in fams[name].samples] == [{}], name
    assert value(fams["nv_pinned_memory_pool_total_bytes"]) == DEFAULT_PINNED
    assert value(fams["nv_pinned_memory_pool_used_bytes"]) == 0  # no pinned pool without a GPU
    assert 0 <= value(fams["nv_cpu_utilization"]) <= 1
    assert 0 < value(fams["nv_cpu_memory_used_bytes"]) <= value(fams["nv_cpu_memory_total_bytes"])
    if not harness.target_is_triton():
        load = fams["nv_model_load_duration_secs"]
        assert load.type == "gauge" and value(load, model=PLAIN, version="1") > 0


def test_pinned_memory_pool_total_is_the_flags(server_factory):
    server = server_factory([PLAIN], extra_args=["--pinned-memory-pool-byte-size", "1000"])
    polled(server, lambda f: value(f["nv_pinned_memory_pool_total_bytes"]) == 1000, "the pinned pool total of 1000")


def cache_args(harness) -> list[str]:
    args = ["--cache-config", "local,size=1048576"]
    if harness.target_is_triton():  # the wheel's tritonserver looks for caches under /opt by default
        where = subprocess.run(["bash", str(harness.TRITON_SCRIPT), "where"], capture_output=True, text=True,
                               check=True).stdout.strip()
        args += ["--cache-directory", f"{where}/caches"]
    return args


def test_cache_summaries_and_no_request_summary_for_cached_models(server_factory, harness):
    server = server_factory([CACHED, PLAIN], extra_args=[
        *cache_args(harness), "--metrics-config", "summary_latencies=true", "--metrics-config",
        "counter_latencies=false"])
    infer_plain(server, 2, CACHED)  # a miss, then a hit: the same input
    infer_plain(server, 1)
    fams = families(server)
    cached = {"model": CACHED, "version": "1"}
    for name, count in (("nv_cache_hit_summary_per_model", 1), ("nv_cache_miss_summary_per_model", 1)):
        fam = fams[name]
        assert fam.type == "summary"
        assert value(fam, name + "_count", **cached) == count
        assert value(fam, name + "_sum", **cached) >= 0
        assert {s.labels.get("quantile") for s in fam.samples} == {None, "0.5", "0.9", "0.95", "0.99", "0.999"}
        assert {s.labels["model"] for s in fam.samples} == {CACHED}  # only models with the cache on
    # Triton's FIXME DLIS-4762: no request summary for a model with the cache on; the others stay
    assert {s.labels["model"] for s in fams["nv_inference_request_summary_us"].samples} == {PLAIN}
    assert value(fams["nv_inference_queue_summary_us"], "nv_inference_queue_summary_us_count", **cached) == 2
    # counter_latencies=false drops the per-model cache counters with the latency counters
    assert not {n for n in fams if n.startswith("nv_cache_num_") and n.endswith("_per_model")}
    assert not {n for n in fams if n.endswith("_duration_per_model") or n.endswith("_duration_us")}


@pytest.mark.inferd_only  # Triton 2.52 added the histogram (decoupled models) and model_metrics; 2.65 extended
def test_first_response_histogram_with_default_and_model_buckets(server_factory):  # it to every model
    repo = server_factory.make_repo({PLAIN: PLAIN, "identity_buckets": PLAIN, STREAMED: STREAMED})
    with open(repo / "identity_buckets" / "config.pbtxt", "a") as f:
        f.write('model_metrics { metric_control [ { metric_identifier { family: "%s" } '
                'histogram_options { buckets: [ 1, 2, 4, 8 ] } } ] }\n' % HISTOGRAM)
    server = server_factory([PLAIN, "identity_buckets", STREAMED], repo=repo,
                            extra_args=["--metrics-config", "histogram_latencies=true"])
    infer_plain(server, 3)
    infer_plain(server, 2, "identity_buckets")
    stream(server, (3, 1, 2))  # 6 responses, 3 first responses
    fam = families(server)[HISTOGRAM]
    assert fam.type == "histogram"
    assert fam.documentation == "Duration from request to first response in milliseconds"
    for model, bounds, count in ((PLAIN, ["100", "500", "2000", "5000", "+Inf"], 3),
                                 ("identity_buckets", ["1", "2", "4", "8", "+Inf"], 2), (STREAMED, None, 3)):
        samples = [s for s in fam.samples if s.labels["model"] == model]
        assert all(s.labels["version"] == "1" for s in samples)
        buckets = [s for s in samples if s.name == HISTOGRAM + "_bucket"]
        assert [s.labels["le"] for s in buckets] == (bounds or ["100", "500", "2000", "5000", "+Inf"])
        assert [s.value for s in buckets] == sorted(s.value for s in buckets)  # cumulative
        assert buckets[-1].value == count, model
        assert value(fam, HISTOGRAM + "_count", model=model) == count
        assert value(fam, HISTOGRAM + "_sum", model=model) >= 0
    infer_plain(server, 1)
    assert value(families(server)[HISTOGRAM], HISTOGRAM + "_count", model=PLAIN) == 4


@pytest.mark.inferd_only  # model_metrics: Triton 2.52 (2.51 refuses the field as unknown)
def test_model_metrics_checked_at_load(server_factory):
    repo = server_factory.make_repo({"incomplete": PLAIN, "unsorted": PLAIN})
    with open(repo / "incomplete" / "config.pbtxt", "a") as f:
        f.write('model_metrics { metric_control [ { metric_identifier { family: "%s" } } ] }\n' % HISTOGRAM)
    with open(repo / "unsorted" / "config.pbtxt", "a") as f:
        f.write('model_metrics { metric_control [ { metric_identifier { family: "%s" } '
                'histogram_options { buckets: [ 4, 2 ] } } ] }\n' % HISTOGRAM)
    for flags, loads in (([], True), (["--metrics-config", "histogram_latencies=true"], False)):
        server = server_factory(repo=repo, models=["incomplete", "unsorted"], control_mode="explicit",
                                extra_args=flags)
        client = server.http_client()
        try:
            with pytest.raises(InferenceServerException, match="metric control must specify 'histogram_options'"):
                client.load_model("incomplete")
            if loads:  # buckets matter only with the histogram on (Triton ignores them otherwise)
                client.load_model("unsorted")
                assert client.is_model_ready("unsorted")
            else:
                with pytest.raises(InferenceServerException, match="must be finite and in increasing order"):
                    client.load_model("unsorted")
        finally:
            client.close()
        server.stop()
