"""pytorch (TorchScript) backend end to end: scripted and traced modules saved by the test, served by
inferd, queried with unmodified tritonclient; answers equal calling the module directly."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import framework_models as fm  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

pytestmark = pytest.mark.inferd_only


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    repo = tmp_path_factory.mktemp("torchrepo") / "models"
    mods = fm.torch_modules()
    modules = {}
    # scripted, Triton's INPUT__0 / OUTPUT__0 naming
    modules["pt_indexed"] = mods["AddSub"]()
    fm.torch_save(repo, "pt_indexed", modules["pt_indexed"], fm.config_pbtxt(
        "pt_indexed", "pytorch", [("INPUT__0", "FP32", [16]), ("INPUT__1", "FP32", [16])],
        [("OUTPUT__0", "FP32", [16]), ("OUTPUT__1", "FP32", [16])],
        extra='parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'))
    # scripted, inputs named after forward()'s arguments (listed in another order than forward's)
    modules["pt_named"] = mods["Named"]()
    fm.torch_save(repo, "pt_named", modules["pt_named"], fm.config_pbtxt(
        "pt_named", "pytorch", [("b", "INT32", [4]), ("a", "INT32", [4])],
        [("SUM", "INT32", [4]), ("DIFF", "INT32", [4])]))
    # traced MLP with a batch dimension and dynamic batching, platform instead of backend
    modules["pt_traced"] = mods["MLP"]()
    config = fm.config_pbtxt("pt_traced", "pytorch", [("INPUT__0", "FP32", [1024])], [("OUTPUT__0", "FP32", [16])],
                             max_batch_size=8, extra="dynamic_batching { }\n")
    config = config.replace('backend: "pytorch"', 'platform: "pytorch_libtorch"')
    fm.torch_save(repo, "pt_traced", modules["pt_traced"], config, traced_example=(torch.zeros(2, 1024),))
    return repo, modules


@pytest.fixture(scope="module")
def server(module_server_factory, models):
    return module_server_factory(repo=models[0], wait_ready=list(models[1]))


@pytest.fixture(scope="module")
def http(server):
    client = server.http_client()
    yield client
    client.close()


def infer(http, model, arrays, datatype):
    inputs = []
    for name, array in arrays.items():
        inp = httpclient.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return http.infer(model, inputs)


def test_scripted_indexed_naming_equals_module(http, models):
    a = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    want = models[1]["pt_indexed"](torch.from_numpy(a), torch.from_numpy(b))
    result = infer(http, "pt_indexed", {"INPUT__0": a, "INPUT__1": b}, "FP32")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), want[0].numpy())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), want[1].numpy())


def test_named_inputs_follow_forward_arguments(http, models):
    a = np.array([1, 2, 3, 4], np.int32)
    b = np.array([10, 20, 30, 40], np.int32)
    want = models[1]["pt_named"](torch.from_numpy(a), torch.from_numpy(b))
    result = infer(http, "pt_named", {"b": b, "a": a}, "INT32")
    np.testing.assert_array_equal(result.as_numpy("SUM"), want[0].numpy())
    np.testing.assert_array_equal(result.as_numpy("DIFF"), want[1].numpy())
    assert result.as_numpy("SUM").tolist() == [12, 24, 36, 48]


def test_traced_mlp_batch_equals_module(http, models):
    x = np.random.default_rng(2).standard_normal((3, 1024)).astype(np.float32)
    with torch.no_grad():
        want = models[1]["pt_traced"](torch.from_numpy(x)).numpy()
    got = infer(http, "pt_traced", {"INPUT__0": x}, "FP32").as_numpy("OUTPUT__0")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    config = http.get_model_config("pt_traced")
    assert config["backend"] == "pytorch" and config["platform"] == "pytorch_libtorch"
