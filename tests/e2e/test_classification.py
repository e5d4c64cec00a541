"""The classification extension with unmodified tritonclient: InferRequestedOutput(..., class_count=k).

`classify` echoes INPUT0 into outputs of several datatypes; OUT and OUT_FP64 have labels.txt ("cat",
"dog", "", "bird fly", "fish"). The expected strings are what Triton 2.51 answers; the module runs
against the real Triton too (INFERD_E2E_TARGET=triton), except the inferd_only tests (Triton 2.51
dies on a classified BYTES output).
"""

from __future__ import annotations

import json
import queue
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROTOCOLS = ["http", "http-binary", "grpc"]
SCORES = [0.1, 0.9, 0.5, 0.9, 0.3]  # two equal best values: index order


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(["classify", "classify_batched"])


def infer(server, protocol: str, values, outputs: dict[str, int], model: str = "classify"):
    """The result of one request asking for `outputs` ({name: class_count}, 0 = not classified)."""
    data = np.asarray(values, dtype=np.float32)
    mod = grpcclient if protocol == "grpc" else httpclient
    inp = mod.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    if protocol == "grpc":
        requested = [grpcclient.InferRequestedOutput(n, class_count=k) for n, k in outputs.items()]
        client = server.grpc_client()
        kw = {"client_timeout": 30}
    else:
        binary = protocol == "http-binary"
        requested = [httpclient.InferRequestedOutput(n, binary_data=binary, class_count=k) for n, k in outputs.items()]
        client = server.http_client()
        kw = {}
    try:
        return client.infer(model, [inp], outputs=requested, **kw)
    finally:
        client.close()


def output_meta(result, protocol: str, name: str) -> tuple[str, list[int]]:
    out = result.get_output(name)
    if protocol == "grpc":
        return out.datatype, list(out.shape)
    if protocol == "http-binary":
        assert out["parameters"]["binary_data_size"] > 0
    else:
        assert "data" in out
    return out["datatype"], out["shape"]


def strings(result, name: str) -> list:
    """The output as nested lists of str (tritonclient gives bytes, or str for HTTP JSON)."""
    return np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])(
        result.as_numpy(name)).tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_top_k_with_labels(server, protocol):
    result = infer(server, protocol, SCORES, {"OUT": 2})
    assert output_meta(result, protocol, "OUT") == ("BYTES", [2])
    assert strings(result, "OUT") == ["0.900000:1:dog", "0.900000:3:bird fly"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_k_beyond_the_classes_gives_them_all(server, protocol):
    result = infer(server, protocol, SCORES, {"OUT": 7})
    assert output_meta(result, protocol, "OUT") == ("BYTES", [5])
    # class 2's line in labels.txt is empty: no label
    assert strings(result, "OUT") == ["0.900000:1:dog", "0.900000:3:bird fly", "0.500000:2", "0.300000:4:fish",
                                      "0.100000:0:cat"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classes_past_the_label_file_have_no_label(server, protocol):
    result = infer(server, protocol, [0.0, 0.0, 0.0, 0.0, 1.0, 3.0, 2.0], {"OUT": 3})
    assert strings(result, "OUT") == ["3.000000:5", "2.000000:6", "1.000000:4:fish"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_value_formatting(server, protocol):
    result = infer(server, protocol, [1e20, -1e-7, 3.14159265, 123456789.0, 1.5e-3], {"OUT": 5})
    assert strings(result, "OUT") == ["100000002004087734272.000000:0:cat", "123456792.000000:3:bird fly",
                                      "3.141593:2", "0.001500:4:fish", "-0.000000:1:dog"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_integer_and_fp64_outputs(server, protocol):
    result = infer(server, protocol, [1, -7, 3, 100, 2], {"OUT_INT32": 3, "OUT_FP64": 2})
    assert output_meta(result, protocol, "OUT_INT32") == ("BYTES", [3])
    assert strings(result, "OUT_INT32") == ["100:3", "3:2", "2:4"]  # no label_filename: no labels
    assert strings(result, "OUT_FP64") == ["100.000000:3:bird fly", "3.000000:2"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classified_and_raw_outputs_side_by_side(server, protocol):
    result = infer(server, protocol, SCORES, {"OUT": 1, "OUT_INT32": 0, "OUT_FP64": 0})
    assert strings(result, "OUT") == ["0.900000:1:dog"]
    assert output_meta(result, protocol, "OUT_INT32") == ("INT32", [5])
    assert result.as_numpy("OUT_INT32").tolist() == [0, 0, 0, 0, 0]
    assert result.as_numpy("OUT_FP64").tolist() == np.float32(SCORES).astype(np.float64).tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batched_model_classifies_each_item(server, protocol):
    result = infer(server, protocol, [SCORES, [5, 4, 3, 2, 1]], {"OUT": 2, "OUT_INT32": 1}, model="classify_batched")
    assert output_meta(result, protocol, "OUT") == ("BYTES", [2, 2])
    assert strings(result, "OUT") == [["0.900000:1:dog", "0.900000:3:bird fly"], ["5.000000:0:cat", "4.000000:1:dog"]]
    assert strings(result, "OUT_INT32") == [["0:0"], ["5:0"]]
    result = infer(server, protocol, [[1, 2], [4, 3], [5, 5]], {"OUT": 1}, model="classify_batched")
    assert output_meta(result, protocol, "OUT") == ("BYTES", [3, 1])
    assert strings(result, "OUT") == [["2.000000:1:dog"], ["4.000000:0:cat"], ["5.000000:0:cat"]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_class_count_zero_leaves_the_output_as_it_is(server, protocol):
    result = infer(server, protocol, SCORES, {"OUT": 0})
    assert output_meta(result, protocol, "OUT") == ("FP32", [5])
    assert result.as_numpy("OUT").tolist() == np.float32(SCORES).tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unsupported_datatype_is_refused(server, protocol):
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, SCORES, {"OUT_FP16": 2})
    assert "class result not available for output due to unsupported type 'FP16'" in info.value.message()
    if protocol == "grpc":
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    else:
        assert info.value.status() == "400"


@pytest.mark.inferd_only
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_output_is_refused(server, protocol):
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, SCORES, {"OUT_STR": 2})
    assert "class result not available for output due to unsupported type 'BYTES'" in info.value.message()


def test_http_class_count_is_an_unsigned_32_bit_number(server):
    status, reply = server.post(
        "/v2/models/classify/infer",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[5],"data":[0.1,0.9,0.5,0.9,0.3]}],'
        b'"outputs":[{"name":"OUT","parameters":{"classification":4294967298}},'
        b'{"name":"OUT_INT32","parameters":{"classification":4294967296}}]}',
        headers={"Content-Type": "application/json"})
    assert status == 200, reply
    outputs = {o["name"]: o for o in json.loads(reply)["outputs"]}
    assert outputs["OUT"]["data"] == ["0.900000:1:dog", "0.900000:3:bird fly"]  # 2**32 + 2 is 2
    assert outputs["OUT_INT32"]["datatype"] == "INT32"  # 2**32 is 0: not classified


def test_grpc_negative_class_count_is_refused(server):
    with pytest.raises(InferenceServerException) as info:
        infer(server, "grpc", SCORES, {"OUT": -1})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "invalid value for 'classification' parameter, expected >= 0" in info.value.message()

def cache_args(harness) -> list[str]:
    args = ["--cache-config", "local,size=1048576"]
    if harness.target_is_triton():  # the wheel's tritonserver looks for caches under /opt by default
        where = subprocess.run(["bash", str(harness.TRITON_SCRIPT), "where"], capture_output=True, text=True,
                               check=True).stdout.strip()
        args += ["--cache-directory", f"{where}/caches"]
    return args


def test_response_cache_keeps_classified_and_raw_apart(server_factory, harness):
    repo = server_factory.make_repo(["classify"])
    config = repo / "classify" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    cached = server_factory(["classify"], repo=repo, extra_args=cache_args(harness))
    for _ in range(2):
        for protocol in ("http", "grpc"):
            raw = infer(cached, protocol, SCORES, {"OUT": 0})
            assert raw.as_numpy("OUT").tolist() == np.float32(SCORES).tolist()
            assert strings(infer(cached, protocol, SCORES, {"OUT": 2}), "OUT") == ["0.900000:1:dog",
                                                                                 "0.900000:3:bird fly"]
            assert strings(infer(cached, protocol, SCORES, {"OUT": 1}), "OUT") == ["0.900000:1:dog"]
            plain = infer(cached, protocol, SCORES, {})
            assert plain.as_numpy("OUT").tolist() == np.float32(SCORES).tolist()


def test_missing_label_file_fails_the_load(server_factory):
    repo = server_factory.make_repo(["classify", "classify_batched"])
    (repo / "classify" / "labels.txt").unlink()
    running = server_factory(["classify", "classify_batched"], repo=repo, wait_ready=["classify_batched"])
    client = running.http_client()
    try:
        index = {m["name"]: m for m in client.get_model_repository_index()}
    finally:
        client.close()
    assert index["classify"]["state"] == "UNAVAILABLE"
    assert "failed to open text file for read" in index["classify"]["reason"]
    assert f"{repo}/classify/labels.txt" in index["classify"]["reason"]


def test_decoupled_stream_responses_are_classified_each(server_factory):
    """decoupled_repeat answers IN=[n] with n responses OUT=[i] (INT32): each one comes back classified."""
    running = server_factory(["decoupled_repeat"])
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(running.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("decoupled_repeat", [inp],
                                  outputs=[grpcclient.InferRequestedOutput("OUT", class_count=1)])
        got = []
        for _ in range(3):
            result, error = events.get(timeout=30)
            assert error is None, error
            assert result.get_output("OUT").datatype == "BYTES"
            got.append(strings(result, "OUT"))
        assert got == [["0:0"], ["1:0"], ["2:0"]]
    finally:
        client.stop_stream()
        client.close()
