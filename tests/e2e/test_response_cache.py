"""Response cache end to end: `--cache-config local,size=BYTES` plus `response_cache { enable: true }`.

The cache_counter model returns COUNT, the number of requests its one instance has executed, so a
response that did not reach the worker shows an old COUNT. Runs against the real Triton too
(INFERD_E2E_TARGET=triton), except the inferd_only tests: Triton's key leaves the requested outputs
out, and its local cache sizes entries differently.
"""

from __future__ import annotations

import itertools
import re
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

CACHED = "cache_counter"
UNCACHED = "cache_uncached"
LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_values = itertools.count(1)


def cache_args(harness, size: int) -> list[str]:
    args = ["--cache-config", f"local,size={size}"]
    if harness.target_is_triton():  # the wheel's tritonserver looks for caches under /opt by default
        where = subprocess.run(["bash", str(harness.TRITON_SCRIPT), "where"], capture_output=True, text=True,
                               check=True).stdout.strip()
        args += ["--cache-directory", f"{where}/caches"]
    return args


def fresh_input(n: int = 4) -> np.ndarray:
    """Values no other test sent, so each test starts with a miss on a shared server."""
    base = next(_values) * 1000.0
    return np.arange(base, base + n, dtype=np.float32)


def http_infer(client, model: str, data: np.ndarray, outputs: list[str] | None = None) -> dict:
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    requested = [httpclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    result = client.infer(model, [inp], outputs=requested)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def grpc_infer(client, model: str, data: np.ndarray) -> dict:
    inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer(model, [inp], client_timeout=30)
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


def stats(server, model: str) -> dict:
    client = server.http_client()
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def counts(s: dict) -> dict:
    inf = s["inference_stats"]
    return {"hit": inf["cache_hit"]["count"], "miss": inf["cache_miss"]["count"],
            "success": inf["success"]["count"], "queue": inf["queue"]["count"],
            "compute": inf["compute_infer"]["count"], "exec": s["execution_count"],
            "inferences": s["inference_count"]}


def settled_counts(server, model: str, expect: dict) -> dict:
    """The model's counters once they reach `expect` (Triton updates some just after replying)."""
    got: dict = {}

    def check():
        got.update(counts(stats(server, model)))
        return got == expect

    try:
        server.wait_until(check, timeout=10, what=f"{model} statistics {expect}")
    except AssertionError:
        pass
    return got


def metrics_samples(server) -> dict[tuple[str, str], float]:
    out = {}
    for line in server.metrics().splitlines():
        m = LINE.match(line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels") or ""))
            out[(m.group("name"), labels.get("model", ""))] = float(m.group("value"))
    return out


@pytest.fixture(scope="module")
def server(module_server_factory, harness):
    return module_server_factory([CACHED, UNCACHED], extra_args=cache_args(harness, 1 << 20))


@pytest.fixture
def http(server):
    client = server.http_client()
    yield client
    client.close()


def test_second_identical_request_does_not_reach_the_worker(server, http):
    data = fresh_input()
    before = counts(stats(server, CACHED))
    first = http_infer(http, CACHED, data)
    second = http_infer(http, CACHED, data)
    np.testing.assert_array_equal(first["OUTPUT0"], data * 2)
    np.testing.assert_array_equal(second["OUTPUT0"], data * 2)
    np.testing.assert_array_equal(second["OUTPUT1"], data + 1)
    assert second["COUNT"][0] == first["COUNT"][0], "the second request was executed by the model"
    # as Triton: hits count as successes (and queue) but never as executions, inferences or compute
    expect = dict(before, hit=before["hit"] + 1, miss=before["miss"] + 1, success=before["success"] + 2,
                  queue=before["queue"] + 2, compute=before["compute"] + 1, exec=before["exec"] + 1,
                  inferences=before["inferences"] + 1)
    assert settled_counts(server, CACHED, expect) == expect


def test_hit_across_protocols(server, http):
    data = fresh_input()
    first = http_infer(http, CACHED, data)
    grpc = server.grpc_client()
    try:
        second = grpc_infer(grpc, CACHED, data)
    finally:
        grpc.close()
    assert second["COUNT"][0] == first["COUNT"][0]
    np.testing.assert_array_equal(second["OUTPUT0"], data * 2)


def test_different_inputs_miss(server, http):
    data = fresh_input()
    first = http_infer(http, CACHED, data)
    other_values = http_infer(http, CACHED, data + 0.5)
    other_shape = http_infer(http, CACHED, np.concatenate([data, data]))
    assert first["COUNT"][0] < other_values["COUNT"][0] < other_shape["COUNT"][0]
    np.testing.assert_array_equal(other_shape["OUTPUT0"], np.concatenate([data, data]) * 2)


@pytest.mark.inferd_only  # Triton 2.51 keys on inputs only: it answers with every output it stored
def test_different_requested_outputs_miss(server, http):
    data = fresh_input()
    everything = http_infer(http, CACHED, data)
    only_output0 = http_infer(http, CACHED, data, ["OUTPUT0"])
    assert set(only_output0) == {"OUTPUT0"}
    again = http_infer(http, CACHED, data, ["OUTPUT0", "COUNT"])
    assert again["COUNT"][0] > everything["COUNT"][0]
    hit = http_infer(http, CACHED, data, ["COUNT", "OUTPUT0"])  # same set, other order: a hit
    assert hit["COUNT"][0] == again["COUNT"][0]


def test_model_without_response_cache_is_never_cached(server, http):
    data = fresh_input()
    before = counts(stats(server, UNCACHED))
    first = http_infer(http, UNCACHED, data)
    second = http_infer(http, UNCACHED, data)
    assert second["COUNT"][0] == first["COUNT"][0] + 1
    expect = dict(before, success=before["success"] + 2, queue=before["queue"] + 2,
                  compute=before["compute"] + 2, exec=before["exec"] + 2, inferences=before["inferences"] + 2)
    assert settled_counts(server, UNCACHED, expect) == expect
    samples = metrics_samples(server)
    assert ("nv_cache_num_hits_per_model", UNCACHED) not in samples


def test_metrics_agree_with_statistics(server, http):
    data = fresh_input()
    http_infer(http, CACHED, data)
    http_infer(http, CACHED, data)

    def agree():
        s = counts(stats(server, CACHED))
        m = metrics_samples(server)
        return (m.get(("nv_cache_num_hits_per_model", CACHED)) == s["hit"]
                and m.get(("nv_cache_num_misses_per_model", CACHED)) == s["miss"] and (s, m))

    s, m = server.wait_until(agree, timeout=10, what="nv_cache_* metrics to match the statistics")
    assert s["hit"] >= 1 and s["miss"] >= 1
    assert m[("nv_cache_hit_duration_per_model", CACHED)] >= 0
    assert m[("nv_cache_miss_duration_per_model", CACHED)] > 0
    assert m[("nv_inference_exec_count", CACHED)] == s["exec"]
    assert m[("nv_inference_request_success", CACHED)] == s["success"]
    # the server-wide gauges exist (Triton refreshes them every --metrics-interval-ms)
    assert ("nv_cache_util", "") in m and ("nv_cache_num_entries", "") in m


def test_config_shows_response_cache(server, http):
    assert http.get_model_config(CACHED)["response_cache"] == {"enable": True}
    grpc = server.grpc_client()
    try:
        assert grpc.get_model_config(CACHED, as_json=True)["config"]["response_cache"] == {"enable": True}
    finally:
        grpc.close()


@pytest.mark.inferd_only  # entry sizes are inferd's accounting (cache.ENTRY_OVERHEAD, TENSOR_OVERHEAD)
def test_lru_eviction_under_a_small_cache(server_factory, harness):
    # one entry: 3 outputs (2 x 1024 B + 8 B) + 128 + 3 x 64 overhead = 2376 B; two fit in 6000 B
    small = server_factory([CACHED], extra_args=cache_args(harness, 6000))
    client = small.http_client()
    try:
        a, b, c = (np.full(256, v, dtype=np.float32) for v in (1.0, 2.0, 3.0))
        count_a = http_infer(client, CACHED, a)["COUNT"][0]
        count_b = http_infer(client, CACHED, b)["COUNT"][0]
        assert count_b == count_a + 1
        assert http_infer(client, CACHED, a)["COUNT"][0] == count_a  # hit; a is now the most recent
        count_c = http_infer(client, CACHED, c)["COUNT"][0]  # evicts b, the least recently used
        assert http_infer(client, CACHED, a)["COUNT"][0] == count_a
        assert http_infer(client, CACHED, c)["COUNT"][0] == count_c
        assert http_infer(client, CACHED, b)["COUNT"][0] > count_c  # evicted: executed again
        samples = metrics_samples(small)
        assert samples[("nv_cache_num_evictions", "")] >= 1
        assert samples[("nv_cache_num_entries", "")] == 2
        big = np.zeros(1024, dtype=np.float32)  # 8 KiB of outputs: larger than the whole cache
        first = http_infer(client, CACHED, big)["COUNT"][0]
        assert http_infer(client, CACHED, big)["COUNT"][0] == first + 1
    finally:
        client.close()


def test_server_without_cache_config_never_caches(server_factory):
    plain = server_factory([CACHED])
    client = plain.http_client()
    try:
        data = fresh_input()
        first = http_infer(client, CACHED, data)
        second = http_infer(client, CACHED, data)
        assert second["COUNT"][0] == first["COUNT"][0] + 1
        s = counts(stats(plain, CACHED))
        assert s["hit"] == 0 and s["miss"] == 0 and s["exec"] == 2
        samples = metrics_samples(plain)
        # as Triton: the model's per-model counters exist (its config asks for the cache) and stay 0;
        # the server-wide gauges do not exist
        assert samples[("nv_cache_num_hits_per_model", CACHED)] == 0
        assert samples[("nv_cache_num_misses_per_model", CACHED)] == 0
        assert ("nv_cache_util", "") not in samples and ("nv_cache_num_entries", "") not in samples
    finally:
        client.close()
