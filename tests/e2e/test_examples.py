"""Serve examples/ as `make run` does and call every model; run the README snippets and infer-ctl."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INFER_CTL = Path(sys.executable).parent / "infer-ctl"
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def server(module_server_factory, harness):
    names = harness.example_model_names()
    assert set(names) >= {"add_sub", "string_reverse", "helper_module", "add_sub_two_instances", "identity_fp32"}
    return module_server_factory(names)


def call(server, protocol: str, model: str, inputs: dict[str, tuple[np.ndarray, str]]):
    mod = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, (data, datatype) in inputs.items():
        t = mod.InferInput(name, list(data.shape), datatype)
        t.set_data_from_numpy(data)
        tensors.append(t)
    if protocol == "http":
        client = server.http_client()
        try:
            return client.infer(model, tensors)
        finally:
            client.close()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return client.infer(model, tensors, client_timeout=30)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_add_sub(server, protocol):
    a = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    r = call(server, protocol, "add_sub", {"INPUT0": (a, "FP32"), "INPUT1": (b, "FP32")})
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(r.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_string_reverse(server, protocol):
    texts = np.array([b"hello", "w\u00f6rld".encode(), b"", b"\xff\x00ab"], dtype=np.object_)
    r = call(server, protocol, "string_reverse", {"INPUT0": (texts, "BYTES")})
    assert r.as_numpy("OUTPUT0").tolist() == [b"olleh", "dlr\u00f6w".encode(), b"", b"ba\x00\xff"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_helper_module(server, protocol):
    x = np.array([1.0, 2.0, 3.0, 6.0], dtype=np.float32)
    r = call(server, protocol, "helper_module", {"INPUT0": (x, "FP32")})
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), (x - x.mean()) / x.std(), rtol=1e-5)
    assert r.as_numpy("SUMMARY").tolist() == [b"n=4 min=1 max=6"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_add_sub_two_instances(server, protocol):
    a = np.arange(16, dtype=np.float32)
    r = call(server, protocol, "add_sub_two_instances", {"INPUT0": (a, "FP32"), "INPUT1": (a, "FP32")})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), np.zeros(16, dtype=np.float32))
    assert r.as_numpy("INSTANCE")[0] in (b"add_sub_two_instances_0_0", b"add_sub_two_instances_0_1")


def test_two_instances_both_serve(server):
    """Concurrent requests spread over both instance processes."""
    a = np.arange(16, dtype=np.float32)

    def one(_):
        r = call(server, "grpc", "add_sub_two_instances", {"INPUT0": (a, "FP32"), "INPUT1": (a, "FP32")})
        return r.as_numpy("INSTANCE")[0]

    seen: set[bytes] = set()
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(5):  # bounded number of bursts
            seen.update(pool.map(one, range(32)))
            if len(seen) == 2:
                break
    assert seen == {b"add_sub_two_instances_0_0", b"add_sub_two_instances_0_1"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_identity_fp32_4mib(server, protocol):
    x = np.random.default_rng(2).standard_normal(1 << 20).astype(np.float32)
    r = call(server, protocol, "identity_fp32", {"INPUT0": (x, "FP32")})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def test_every_example_is_ready_and_described(server):
    client = server.http_client()
    try:
        for name in [p.name for p in EXAMPLES.iterdir() if (p / "config.pbtxt").exists()]:
            assert client.is_model_ready(name), name
            md = client.get_model_metadata(name)
            assert md["platform"] == "python"
            assert md["inputs"] and md["outputs"]
    finally:
        client.close()


# ---------------------------------------------------------------------------- README snippets


def readme_python_snippets() -> list[str]:
    text = (EXAMPLES / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("index", range(len(readme_python_snippets())))
def test_readme_snippet_runs(server, index):
    code = readme_python_snippets()[index]
    code = code.replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------------------- infer-ctl


def ctl(server, *args: str) -> subprocess.CompletedProcess:
    if not INFER_CTL.exists():
        pytest.fail(f"{INFER_CTL} is not installed (pip install -e .)", pytrace=False)
    return subprocess.run([str(INFER_CTL), "--url", server.http_base, "--timeout", "30", *args],
                          capture_output=True, text=True, timeout=60)


def test_infer_ctl_standard_endpoints(server):
    assert ctl(server, "health").returncode == 0
    out = ctl(server, "--json", "index")
    assert out.returncode == 0, out.stderr
    names = {e["name"] for e in json.loads(out.stdout)}
    assert "add_sub" in names
    out = ctl(server, "--json", "metadata", "add_sub")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == "add_sub"
    out = ctl(server, "config", "string_reverse")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == "string_reverse"
    bad = ctl(server, "metadata", "no_such_model")
    assert bad.returncode == 1
    assert "no_such_model" in bad.stderr


@pytest.mark.inferd_only
def test_infer_ctl_status(server):
    out = ctl(server, "--json", "status")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    models = {m["name"]: m for m in doc["models"]}
    two = models["add_sub_two_instances"]
    assert len(two["instances"]) == 2
    assert all(i["pid"] for i in two["instances"])


@pytest.mark.parametrize("elements", [16, 1 << 20])  # a ZeroMQ frame and a shared-memory region
def test_models_may_edit_inputs_in_place(server_factory, elements):
    server = server_factory(["inplace_double"])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for _ in range(3):  # regions are reused: each request must see its own data
            data = np.random.default_rng(elements).standard_normal(elements).astype(np.float32)
            inp = grpcclient.InferInput("INPUT0", [elements], "FP32")
            inp.set_data_from_numpy(data)
            out = client.infer("inplace_double", [inp], client_timeout=30).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, data * 2)
    finally:
        client.close()
