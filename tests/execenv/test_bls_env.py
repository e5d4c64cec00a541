"""BLS across environments: a model in the Python 3.10 conda-pack environment calls a model running on
the server's interpreter, and the other way round, with a tensor large enough to go by handle."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from .helpers import add_report_model

CALLER = textwrap.dedent('''\
    import json, sys
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                target = json.loads(request.parameters())["target"]
                big = np.arange(100000, dtype=np.float32)  # 400 KB: through shared memory
                info = pb_utils.InferenceRequest(
                    model_name=target, requested_output_names=["INFO"],
                    inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))]).exec()
                echo = pb_utils.InferenceRequest(
                    model_name="echo_big", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", big)]).exec()
                if info.has_error() or echo.has_error():
                    raise pb_utils.TritonModelException((info.error() or echo.error()).message())
                callee = json.loads(pb_utils.get_output_tensor_by_name(info, "INFO").as_numpy()[0])
                same = bool(np.array_equal(pb_utils.get_output_tensor_by_name(echo, "OUTPUT0").as_numpy(), big))
                me = {"caller": "%d.%d.%d" % sys.version_info[:3], "callee": callee["python"], "echo_ok": same}
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("INFO", np.array([json.dumps(me).encode()], dtype=np.object_))]))
            return out
''')

ECHO = textwrap.dedent('''\
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().copy())]) for r in requests]
''')


def _caller(repo: Path, name: str, env: str | None) -> None:
    d = add_report_model(repo, name, env)
    (d / "1" / "model.py").write_text(CALLER)


def _echo(repo: Path, env: str | None) -> None:
    d = add_report_model(repo, "echo_big", env)
    (d / "1" / "model.py").write_text(ECHO)
    cfg = (d / "config.pbtxt").read_text()
    cfg = cfg.replace('input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]',
                      'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]')
    cfg = cfg.replace('output [ { name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] } ]',
                      'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]')
    (d / "config.pbtxt").write_text(cfg)


def _ask(server: Any, caller: str, target: str) -> dict[str, Any]:
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}],
                       "parameters": {"target": target}}).encode()
    code, raw = server.post(f"/v2/models/{caller}/infer", body, headers={"Content-Type": "application/json"},
                            timeout=60)
    assert code == 200, raw
    return json.loads(json.loads(raw)["outputs"][0]["data"][0])


def test_bls_between_python_versions(server_factory: Any, tmp_path: Path, condapack_env: dict[str, Any]) -> None:
    tarball = condapack_env["tarball"]
    repo = tmp_path / "repo"
    repo.mkdir()
    add_report_model(repo, "env_report", tarball)
    add_report_model(repo, "plain_report", None)
    _caller(repo, "caller_in_env", tarball)
    _caller(repo, "caller_plain", None)
    _echo(repo, tarball)  # the large tensor crosses from and to the 3.10 environment
    names = ["env_report", "plain_report", "caller_in_env", "caller_plain", "echo_big"]
    server = server_factory(repo=repo, inferd_args=["--env-cache-dir", str(tmp_path / "envcache")],
                            wait_ready=names, start_timeout=180)
    server_py = "%d.%d." % sys.version_info[:2]
    got = _ask(server, "caller_in_env", "plain_report")
    assert got["caller"].startswith("3.10.") and got["callee"].startswith(server_py) and got["echo_ok"], got
    got = _ask(server, "caller_plain", "env_report")
    assert got["caller"].startswith(server_py) and got["callee"].startswith("3.10.") and got["echo_ok"], got
