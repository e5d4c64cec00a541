"""Model repository extension in explicit mode: index, load, load with a config override, unload,
states and reasons, and a failing model that stays UNAVAILABLE while the others serve."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODELS = ["add_sub", "identity_fp32", "init_fail", "sleep", "string_reverse"]
INIT_FAIL_TEXT = "init_fail: deliberate failure in initialize"


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS, control_mode="explicit", load_models=["add_sub"])


@pytest.fixture(scope="module")
def http(server):
    client = server.http_client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = server.grpc_client()
    yield client
    client.close()


def index_by_name(http) -> dict[str, dict]:
    return {entry["name"]: entry for entry in http.get_model_repository_index()}


def identity_infer(http, n: int = 3):
    data = np.arange(n, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [n], "FP32")
    inp.set_data_from_numpy(data)
    result = http.infer("identity_fp32", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def add_sub_infer(http):
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = http.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def wait_unloaded(server, http, name: str) -> dict:
    """Unload returns once requests drained; the index may say UNLOADING for a moment after."""
    def done():
        entry = index_by_name(http)[name]
        return entry if entry.get("state") == "UNAVAILABLE" else None

    return server.wait_until(done, timeout=10, what=f"{name} UNAVAILABLE in the index")


# ---------------------------------------------------------------------------- index


def test_index_lists_every_model_directory(http):
    index = index_by_name(http)
    assert set(index) >= set(MODELS)
    assert index["add_sub"] == {"name": "add_sub", "version": "1", "state": "READY"}
    # never loaded: the name only
    assert index["sleep"] == {"name": "sleep"}


def test_index_ready_only(server):
    status, body = server.post("/v2/repository/index", json.dumps({"ready": True}).encode())
    assert status == 200
    entries = json.loads(body)
    assert entries, "add_sub is loaded"
    assert all(e.get("state") == "READY" for e in entries)
    assert "add_sub" in {e["name"] for e in entries}
    assert "sleep" not in {e["name"] for e in entries}


def test_index_grpc_matches_http(http, grpc):
    g = grpc.get_model_repository_index(as_json=True, client_timeout=10)
    grpc_names = {m["name"]: m for m in g["models"]}
    http_names = index_by_name(http)
    assert set(grpc_names) == set(http_names)
    assert grpc_names["add_sub"]["state"] == "READY"


# ---------------------------------------------------------------------------- load / unload


def test_load_infer_unload_http(server, http):
    assert not http.is_model_ready("identity_fp32")
    http.load_model("identity_fp32")
    assert http.is_model_ready("identity_fp32")
    assert index_by_name(http)["identity_fp32"]["state"] == "READY"
    identity_infer(http)

    http.unload_model("identity_fp32")
    entry = wait_unloaded(server, http, "identity_fp32")
    assert entry["version"] == "1"
    assert not http.is_model_ready("identity_fp32")
    with pytest.raises(InferenceServerException) as err:
        identity_infer(http)
    assert err.value.status() == "404"
    assert "identity_fp32" in err.value.message()
    # the others are untouched
    add_sub_infer(http)


def test_load_unload_grpc(server, grpc, http):
    grpc.load_model("string_reverse", client_timeout=60)
    assert grpc.is_model_ready("string_reverse", client_timeout=5)
    inp = grpcclient.InferInput("INPUT0", [2], "BYTES")
    inp.set_data_from_numpy(np.array([b"abc", b"xy"], dtype=np.object_))
    out = grpc.infer("string_reverse", [inp], client_timeout=30).as_numpy("OUTPUT0")
    assert out.tolist() == [b"cba", b"yx"]
    grpc.unload_model("string_reverse", client_timeout=60)
    wait_unloaded(server, http, "string_reverse")
    assert not grpc.is_model_ready("string_reverse", client_timeout=5)


def test_reload_after_unload(server, http):
    for _ in range(2):
        http.load_model("identity_fp32")
        identity_infer(http)
        http.unload_model("identity_fp32")
        wait_unloaded(server, http, "identity_fp32")


def test_load_with_config_override(server, http):
    override = {
        "name": "identity_fp32",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
    }
    http.load_model("identity_fp32", config=json.dumps(override))
    try:
        md = http.get_model_metadata("identity_fp32")
        assert md["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [3]}]
        cfg = http.get_model_config("identity_fp32")
        assert cfg["instance_group"][0]["count"] == 2
        assert cfg["input"][0]["dims"] == [3]
        identity_infer(http, n=3)
        with pytest.raises(InferenceServerException) as err:
            identity_infer(http, n=4)  # the override fixed the shape to [3]
        assert err.value.status() == "400"

        # a bad override is refused and leaves the loaded model serving
        with pytest.raises(InferenceServerException):
            http.load_model("identity_fp32", config="{not json")
        assert http.is_model_ready("identity_fp32")
        identity_infer(http, n=3)
    finally:
        http.unload_model("identity_fp32")
        wait_unloaded(server, http, "identity_fp32")


# ---------------------------------------------------------------------------- failures


def test_failing_model_unavailable_while_others_serve(server, http, grpc):
    with pytest.raises(InferenceServerException) as err:
        http.load_model("init_fail")
    assert err.value.status() == "400"
    assert INIT_FAIL_TEXT in err.value.message()
    assert "init_fail" in err.value.message()

    entry = index_by_name(http)["init_fail"]
    assert entry["state"] == "UNAVAILABLE"
    assert INIT_FAIL_TEXT in entry["reason"]
    assert not http.is_model_ready("init_fail")

    with pytest.raises(InferenceServerException) as gerr:
        grpc.load_model("init_fail", client_timeout=60)
    assert gerr.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert INIT_FAIL_TEXT in gerr.value.message()

    # the server and the other models are fine
    assert http.is_server_live()
    assert http.is_model_ready("add_sub")
    add_sub_infer(http)


def test_load_unknown_model_fails(http, grpc):
    with pytest.raises(InferenceServerException) as err:
        http.load_model("no_such_model")
    assert "no_such_model" in err.value.message()
    with pytest.raises(InferenceServerException):
        grpc.load_model("no_such_model", client_timeout=30)
    assert "no_such_model" not in index_by_name(http)
    assert http.is_server_live()
