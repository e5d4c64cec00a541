"""Health, server/model metadata, model config and model readiness, with unmodified tritonclient."""

from __future__ import annotations

import asyncio
import json

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from conftest import target_is_triton

MODELS = ["add_sub", "autocomplete", "identity", "string_reverse"]

# Extensions inferd must advertise at least (tritonclient treats the list as opaque strings).
CORE_EXTENSIONS = {
    "binary_tensor_data", "model_repository", "model_configuration", "statistics", "parameters"}
# Everything Triton advertises; inferd must not invent names outside this list.
TRITON_EXTENSIONS = {
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging",
}

ADD_SUB_METADATA = {
    "name": "add_sub",
    "versions": ["1"],
    "platform": "python",
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [16]},
    ],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [16]},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [16]},
    ],
}


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


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


def _grpc_metadata_dict(md) -> dict:
    return {
        "name": md.name,
        "versions": list(md.versions),
        "platform": md.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in md.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in md.outputs],
    }


# ---------------------------------------------------------------------------- health


def test_health_raw_http(server):
    status, body = server.get("/v2/health/live")
    assert (status, body) == (200, b"")
    status, body = server.get("/v2/health/ready")
    assert (status, body) == (200, b"")


def test_health_tritonclient(http, grpc):
    assert http.is_server_live()
    assert http.is_server_ready()
    assert grpc.is_server_live(client_timeout=5)
    assert grpc.is_server_ready(client_timeout=5)


def test_health_grpc_aio(server):
    async def run():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            live = await client.is_server_live(client_timeout=5)
            ready = await client.is_server_ready(client_timeout=5)
            model_ready = await client.is_model_ready("add_sub", client_timeout=5)
            md = await client.get_model_metadata("add_sub", as_json=True, client_timeout=5)
        finally:
            await client.close()
        return live, ready, model_ready, md

    live, ready, model_ready, md = asyncio.run(run())
    assert live and ready and model_ready
    assert md["name"] == "add_sub"
    assert [i["name"] for i in md["inputs"]] == ["INPUT0", "INPUT1"]


def test_unknown_path_is_404(server):
    status, body = server.get("/v2/no/such/route")
    assert status == 404
    assert "error" in json.loads(body)


# ---------------------------------------------------------------------------- server metadata


def test_server_metadata_http(http):
    md = http.get_server_metadata()
    assert md["name"] == "triton"
    assert isinstance(md["version"], str) and md["version"]
    extensions = set(md["extensions"])
    assert extensions >= CORE_EXTENSIONS, CORE_EXTENSIONS - extensions
    assert extensions <= TRITON_EXTENSIONS, extensions - TRITON_EXTENSIONS


@pytest.mark.skipif(target_is_triton(), reason="Triton lists every extension it was built with")
def test_server_metadata_lists_only_working_extensions(http):
    """This server has no CUDA shared memory: it is not advertised; trace works (issue 24) and is."""
    extensions = http.get_server_metadata()["extensions"]
    assert "trace" in extensions and "cuda_shared_memory" not in extensions
    assert "system_shared_memory" in extensions and "logging" in extensions


def test_server_metadata_grpc_matches_http(http, grpc):
    md = grpc.get_server_metadata(client_timeout=5)
    ref = http.get_server_metadata()
    assert md.name == ref["name"]
    assert md.version == ref["version"]
    assert list(md.extensions) == list(ref["extensions"])


# ---------------------------------------------------------------------------- model metadata


def test_model_metadata_http(http):
    assert http.get_model_metadata("add_sub") == ADD_SUB_METADATA
    assert http.get_model_metadata("add_sub", model_version="1") == ADD_SUB_METADATA


def test_model_metadata_grpc(grpc):
    assert _grpc_metadata_dict(grpc.get_model_metadata("add_sub", client_timeout=5)) == ADD_SUB_METADATA
    md = grpc.get_model_metadata("add_sub", model_version="1", as_json=True, client_timeout=5)
    assert md["name"] == "add_sub"
    # protobuf JSON renders int64 as strings
    assert [int(d) for d in md["inputs"][0]["shape"]] == [16]


def test_model_metadata_batching_shape(http, grpc):
    """max_batch_size > 0 puts -1 in front of the dims (autocomplete sets mbs 8, dims [4])."""
    md = http.get_model_metadata("autocomplete")
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    assert md["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    gmd = _grpc_metadata_dict(grpc.get_model_metadata("autocomplete", client_timeout=5))
    assert gmd["inputs"] == md["inputs"] and gmd["outputs"] == md["outputs"]


def test_model_metadata_every_datatype(http):
    md = http.get_model_metadata("identity")
    by_name = {t["name"]: t for t in md["inputs"]}
    assert by_name["INPUT_BYTES"] == {"name": "INPUT_BYTES", "datatype": "BYTES", "shape": [-1]}
    assert by_name["INPUT_BOOL"]["datatype"] == "BOOL"
    assert by_name["INPUT_FP16"]["datatype"] == "FP16"
    assert by_name["INPUT_UINT64"]["datatype"] == "UINT64"
    assert len(md["inputs"]) == 13 and len(md["outputs"]) == 13
    assert {t["datatype"] for t in md["outputs"]} == {
        "BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
        "FP16", "FP32", "FP64", "BYTES"}


# ---------------------------------------------------------------------------- model config


def test_model_config_http_fields(http):
    cfg = http.get_model_config("add_sub")
    assert cfg["name"] == "add_sub"
    assert cfg["backend"] == "python"
    assert cfg["platform"] == ""
    assert cfg["max_batch_size"] == 0
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    assert cfg["default_model_filename"] == "model.py"
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["input"][0]["dims"] == [16]  # int64 dims rendered as JSON numbers
    assert cfg["output"][1]["name"] == "OUTPUT1"
    assert cfg["output"][1]["dims"] == [16]
    group = cfg["instance_group"][0]
    assert group["kind"] == "KIND_CPU"
    assert group["count"] == 1
    assert group["name"] == "add_sub_0"  # a listed group without a name is <model>_<index>
    assert "dynamic_batching" not in cfg


def test_model_config_autocompleted(http):
    cfg = http.get_model_config("autocomplete")
    assert cfg["name"] == "autocomplete"
    assert cfg["backend"] == "python"
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["name"] == "INPUT0" and cfg["input"][0]["dims"] == [4]
    assert cfg["output"][0]["data_type"] == "TYPE_FP32"
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [8]


def test_model_config_grpc(grpc):
    cfg = grpc.get_model_config("add_sub", client_timeout=5).config
    assert cfg.name == "add_sub"
    assert cfg.backend == "python"
    assert list(cfg.input[0].dims) == [16]
    assert cfg.input[0].data_type == 11  # TYPE_FP32
    as_json = grpc.get_model_config("autocomplete", as_json=True, client_timeout=5)
    assert as_json["config"]["max_batch_size"] == 8


def test_model_config_raw_http_json(server):
    status, body = server.get("/v2/models/string_reverse/config")
    assert status == 200
    cfg = json.loads(body)
    assert cfg["input"][0]["data_type"] == "TYPE_STRING"
    assert cfg["input"][0]["dims"] == [-1]


# ---------------------------------------------------------------------------- model readiness


def test_model_ready(http, grpc):
    for name in MODELS:
        assert http.is_model_ready(name), name
        assert grpc.is_model_ready(name, client_timeout=5), name
    assert http.is_model_ready("add_sub", model_version="1")
    assert grpc.is_model_ready("add_sub", model_version="1", client_timeout=5)


def test_model_not_ready(server, http, grpc):
    assert not http.is_model_ready("no_such_model")
    assert not http.is_model_ready("add_sub", model_version="2")
    assert server.get("/v2/models/add_sub/versions/2/ready")[0] == 400
    assert server.get("/v2/models/no_such_model/ready")[0] == 400
    try:
        ready = grpc.is_model_ready("add_sub", model_version="2", client_timeout=5)
    except Exception as exc:  # newer Triton answers an error status instead of ready=false
        assert isinstance(exc, grpcclient.InferenceServerException)
    else:
        assert not ready
