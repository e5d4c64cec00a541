"""Load overrides (the `file:<path>` parameters of the repository load API) on a real server.

Each such load writes a private model directory under the run directory. It must go when the versions
loaded from it are unloaded or replaced by a reload (once their workers stopped) and on every failed load
(issue 38 item 4: 30 loads of 1 MiB used to leave 30 MiB), and a key no filesystem can take is the
client's error, 400 naming the key, never a 500 with a traceback (item 6).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.inferd_only  # --run-dir and the run directory's layout are inferd's

MIB = 1 << 20


@pytest.fixture(scope="module")
def served(module_server_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    run_dir = tmp_path_factory.mktemp("run")
    server = module_server_factory(["add_sub"], control_mode="explicit", load_models=["add_sub"],
                                   inferd_args=["--run-dir", str(run_dir)])
    return server, run_dir


@pytest.fixture
def client(served: tuple[Any, Path]) -> Any:
    server, _run_dir = served
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
        yield c
        c.load_model("add_sub")  # back to the repository's model: no override directory in use


def overrides(run_dir: Path) -> tuple[int, int]:
    """(override directories, bytes in them) under the run directory."""
    base = run_dir / "overrides"
    if not base.exists():
        return 0, 0
    return len(list(base.iterdir())), sum(f.stat().st_size for f in base.rglob("*") if f.is_file())


def model_files(harness: Any, blob: int = MIB) -> dict[str, bytes]:
    code = (harness.EXAMPLE_MODELS / "add_sub" / "1" / "model.py").read_bytes()
    return {"file:1/model.py": code, "file:1/blob.bin": os.urandom(blob)}


def config_of(client: Any) -> str:
    config = client.get_model_config("add_sub")
    config.pop("parameters", None)
    return json.dumps(config)


def assert_serves(client: Any) -> None:
    a = np.arange(16, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_reloads_and_unloads_leave_only_the_directory_in_use(served: tuple[Any, Path], client: Any,
                                                              harness: Any) -> None:
    _server, run_dir = served
    config, files = config_of(client), model_files(harness)
    sizes = []
    for _ in range(10):  # each a reload of the loaded model: the previous directory goes with its workers
        client.load_model("add_sub", config=config, files=files)
        sizes.append(overrides(run_dir))
    assert sizes == [sizes[0]] * 10 and sizes[0][0] == 1 and MIB <= sizes[0][1] < MIB + (64 << 10), sizes
    assert_serves(client)
    client.unload_model("add_sub")
    assert overrides(run_dir) == (0, 0)
    for _ in range(5):
        client.load_model("add_sub", config=config, files=files)
        assert_serves(client)
        client.unload_model("add_sub")
    assert overrides(run_dir) == (0, 0)
    client.load_model("add_sub", config=config, files=files)
    client.load_model("add_sub")  # a reload without files: the old directory goes too
    assert overrides(run_dir) == (0, 0)
    assert_serves(client)


def test_failed_loads_leave_no_directory(served: tuple[Any, Path], client: Any, harness: Any) -> None:
    _server, run_dir = served
    config, files = config_of(client), model_files(harness)
    failing = dict(files, **{"file:1/model.py": b"raise RuntimeError('deliberately broken model')\n"})
    with pytest.raises(InferenceServerException, match="deliberately broken model"):
        client.load_model("add_sub", config=config, files=failing)  # the worker fails to start
    assert overrides(run_dir) == (0, 0)
    with pytest.raises(InferenceServerException):
        client.load_model("add_sub", config='{"backend": "python", "input": 7}', files=files)  # a bad config
    assert overrides(run_dir) == (0, 0)
    assert_serves(client)  # a failed reload keeps the old versions serving
    client.load_model("add_sub", config=config, files=files)
    in_use = overrides(run_dir)
    assert in_use[0] == 1
    with pytest.raises(InferenceServerException, match="deliberately broken model"):
        client.load_model("add_sub", config=config, files=failing)
    assert overrides(run_dir) == in_use  # the serving versions' directory stays, the failed one went
    assert_serves(client)


def _load(server: Any, parameters: dict[str, Any]) -> tuple[int, str]:
    body = {"parameters": {k: (base64.b64encode(v).decode() if isinstance(v, bytes) else v)
                           for k, v in parameters.items()}}
    code, raw = server.post("/v2/repository/models/add_sub/load", json.dumps(body).encode())
    return code, json.loads(raw).get("error", "")


def test_unwritable_file_keys_are_client_errors(served: tuple[Any, Path], client: Any) -> None:
    server, run_dir = served
    config = config_of(client)
    long_name = "file:1/" + "m" * 300 + ".py"
    deep = "file:" + "/".join(["d" * 200] * 25)  # each name fits, the path does not (PATH_MAX)
    log_start = len(server.log())  # (the tests before this one log a broken model's traceback)
    cases = [
        ({long_name: b"x"}, ["file:1/mmmm", "a file or directory name is longer than 255 bytes"]),
        ({"file:1": b"x", "file:1/model.py": b"x"},
         ["file parameters 'file:1' and 'file:1/model.py' conflict: '1' cannot be both a file and a directory"]),
        ({"file:1/model.py": b"x", "file:1": b"x"}, ["'file:1' and 'file:1/model.py' conflict"]),
        ({"file:1/model.py": b"x", "file:1//model.py": b"y"},
         ["file parameters 'file:1/model.py' and 'file:1//model.py' name the same file"]),
        ({deep: b"x"}, ["file parameter 'file:dddd", "cannot be written: File name too long"]),
    ]
    for files, words in cases:
        code, error = _load(server, {"config": config, **files})
        assert code == 400 and all(w in error for w in words), (list(files)[0][:40], code, error)
        assert overrides(run_dir) == (0, 0)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            grpc.load_model("add_sub", config=config, files={"file:1": b"x", "file:1/model.py": b"x"})
    finally:
        grpc.close()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "conflict" in err.value.message()
    log = server.log()[log_start:]
    assert "Traceback" not in log and "internal error" not in log, log
    assert_serves(client)
