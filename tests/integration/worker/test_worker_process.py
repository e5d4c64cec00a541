"""The worker as a process, driven by a fake supervisor (raw pyzmq ROUTER), as in the protocol doc.

Extra interpreters (e.g. a 3.9 venv with numpy + pyzmq) can be given in INFERD_TEST_WORKER_PYTHONS
(os.pathsep-separated); each runs the main scenario too.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from inferd.worker.wire import bytes_codec, shm
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode

from .workerharness import FakeSupervisor, rss_kib

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX shm + prctl")

EXTRA = [p for p in os.environ.get("INFERD_TEST_WORKER_PYTHONS", "").split(os.pathsep) if p]

CONFIG = {
    "name": "demo",
    "backend": "python",
    "max_batch_size": 0,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "OUTPUT1", "data_type": "TYPE_STRING", "dims": [-1]},
    ],
    "instance_group": [{"name": "demo_0", "kind": "KIND_CPU", "count": 1}],
}

MODEL_PY = '''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

import common          # <model_dir>/common.py
import helper          # <model_dir>/<version>/helper.py


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_output({"name": "EXTRA", "data_type": "TYPE_INT32", "dims": [1]})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])
        try:
            import inferd.supervisor  # noqa: F401
            supervisor = "imported"
        except ImportError as exc:
            supervisor = "refused: %s" % exc
        record = dict(args, supervisor=supervisor, model_dir=pb_utils.get_model_dir(),
                      helpers=[common.NAME, helper.NAME])
        with open(os.path.join(args["model_repository"], "init.json"), "w") as f:
            json.dump(record, f)
        pb_utils.Logger.log_info("initialized %s" % args["model_instance_name"])

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if params.get("raise"):
                raise ValueError("boom")
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            words = text.as_numpy() if text is not None else np.array([b"none"], dtype=object)
            y = x * 2 if not params.get("wrong_dtype") else (x * 2).astype(np.float64)
            out = [pb_utils.Tensor("OUTPUT0", y),
                   pb_utils.Tensor("OUTPUT1", np.array([w.upper() for w in words], dtype=object)),
                   pb_utils.Tensor("UNDECLARED", np.zeros(1, np.int8))]
            if params.get("error"):
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("bad input", pb_utils.TritonError.INVALID_ARG)))
            else:
                responses.append(pb_utils.InferenceResponse(out, parameters={"n": int(x.size)}))
        return responses

    def finalize(self):
        with open(os.path.join(self.args["model_repository"], "finalized"), "w") as f:
            f.write("yes")
'''


def write_model(root: Path, name: str = "demo", model_py: str = MODEL_PY, config: dict | None = None) -> Path:
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(model_py))
    (model_dir / "1" / "helper.py").write_text("NAME = 'helper'\n")
    (model_dir / "common.py").write_text("NAME = 'common'\n")
    cfg = dict(config or CONFIG, name=name)
    (model_dir / "config.json").write_text(json.dumps(cfg))
    return model_dir


def load_msg(model_dir: Path, config: dict, instance: str = "demo_0_0") -> m.LoadModel:
    return m.LoadModel(model_name=config["name"], model_dir=str(model_dir), version="1",
                       config_json=json.dumps(config), backend="python", instance_name=instance,
                       instance_kind="CPU", device_id=0)


def fp32_frame(name: str, values: np.ndarray, frame: int) -> tuple[m.TensorRef, bytes]:
    data = np.ascontiguousarray(values, dtype="<f4")
    return m.TensorRef(name=name, datatype="FP32", shape=list(data.shape), frame=frame,
                       nbytes=data.nbytes), data.tobytes()


def output(result_frames: list, item: m.ResponseItem, name: str) -> np.ndarray:
    ref = next(o for o in item.outputs if o.name == name)
    if ref.loc == "shm":  # large outputs: written into the worker's own region
        region = shm.attach(ref.region, readonly=True)
        buf = bytes(region.buf[ref.offset : ref.offset + ref.nbytes])
        region.close()
    else:
        buf = result_frames[ref.frame].bytes[ref.offset : ref.offset + ref.nbytes]  # small outputs share a frame
    if ref.datatype == "BYTES":
        return bytes_codec.deserialize(buf).reshape(ref.shape)
    dtype = {"FP32": "<f4", "INT32": "<i4", "FP64": "<f8"}[ref.datatype]
    return np.frombuffer(buf, dtype=dtype).reshape(ref.shape)


@pytest.fixture
def sup():
    s = FakeSupervisor()
    yield s
    s.close()


def run_main_scenario(sup: FakeSupervisor, tmp_path: Path) -> None:
    model_dir = write_model(tmp_path)
    t0 = time.perf_counter()
    proc = sup.spawn("w1")
    hello, _ = sup.expect(m.Hello)
    spawn_to_hello = time.perf_counter() - t0
    assert hello.wire_version == m.WIRE_VERSION and hello.pid == proc.pid and hello.instance_name == "w1"
    assert hello.numpy_version and hello.zmq_version
    assert spawn_to_hello < 2.0, spawn_to_hello

    # AutoComplete: model's static hook runs on pb_utils.ModelConfig
    sup.send("w1", m.AutoComplete(model_name="demo", model_dir=str(model_dir), version="1",
                                  config_json=json.dumps(CONFIG), backend="python"))
    ac, _ = sup.expect(m.AutoCompleteResult)
    assert ac.error is None, ac.error
    completed = json.loads(ac.config_json)
    assert [o["name"] for o in completed["output"]] == ["OUTPUT0", "OUTPUT1", "EXTRA"]

    # LoadModel: initialize(args) with Triton's keys
    sup.send("w1", load_msg(model_dir, CONFIG))
    loaded, _ = sup.expect(m.LoadResult)
    assert loaded.error is None and loaded.backend == "python"
    record = json.loads((model_dir / "init.json").read_text())
    assert record["model_config"] == json.dumps(CONFIG)
    assert record["model_instance_kind"] == "CPU" and record["model_instance_name"] == "demo_0_0"
    assert record["model_instance_device_id"] == "0" and record["model_version"] == "1"
    assert record["model_repository"] == str(model_dir) and record["model_name"] == "demo"
    assert record["model_dir"] == str(model_dir / "1")
    assert record["helpers"] == ["common", "helper"]
    assert record["supervisor"].startswith("refused"), record["supervisor"]
    triton_keys = {"model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
                   "model_repository", "model_version", "model_name"}
    assert set(record) - {"supervisor", "model_dir", "helpers"} == triton_keys

    # Execute: inline frame inputs (FP32 + BYTES) and an shm input, two requests in one batch
    big = np.arange(100_000, dtype="<f4")
    region = shm.create(shm.make_name(os.getpid(), "wt%d" % proc.pid), big.nbytes + 64)
    region_name = region.name  # a handle: the worker attaches it through /proc/<our pid>/fd
    try:
        region.buf[64 : 64 + big.nbytes] = big.tobytes()
        ref0, data0 = fp32_frame("INPUT0", np.array([1, 2, 3]), 0)
        text = bytes_codec.serialize(np.array([b"ab", b"cd"], dtype=object))
        ref_text = m.TensorRef(name="TEXT", datatype="BYTES", shape=[2], frame=1, nbytes=len(text))
        ref_shm = m.TensorRef(name="INPUT0", datatype="FP32", shape=[100_000], loc="shm",
                              region=region_name, offset=64, nbytes=big.nbytes)
        batch = m.Execute(batch_id=7, requests=[
            m.RequestItem(request_id=1, id="a", inputs=[ref0, ref_text], requested_outputs=[]),
            m.RequestItem(request_id=2, id="b", inputs=[ref_shm], requested_outputs=["OUTPUT0"]),
        ])
        sup.send("w1", batch, [data0, text])
        result, frames = sup.expect(m.ExecuteResult)
        assert result.batch_id == 7 and [r.request_id for r in result.responses] == [1, 2]
        r1, r2 = result.responses
        assert r1.error is None and r2.error is None
        assert sorted(o.name for o in r1.outputs) == ["OUTPUT0", "OUTPUT1"]  # pruned to config outputs
        np.testing.assert_array_equal(output(frames, r1, "OUTPUT0"), [2, 4, 6])
        assert list(output(frames, r1, "OUTPUT1")) == [b"AB", b"CD"]
        assert r1.parameters == {"n": 3}
        assert [o.name for o in r2.outputs] == ["OUTPUT0"]  # pruned to requested outputs
        np.testing.assert_array_equal(output(frames, r2, "OUTPUT0"), big * 2)
        assert result.compute_infer_ns > 0

        # the region is cached; forget_regions drops it
        sup.send("w1", m.Execute(batch_id=8, requests=[
            m.RequestItem(request_id=3, id="c", inputs=[ref_shm], requested_outputs=["OUTPUT0"])]))
        result, frames = sup.expect(m.ExecuteResult)
        np.testing.assert_array_equal(output(frames, result.responses[0], "OUTPUT0"), big * 2)
    finally:
        region.close()

    # an exception in execute fails the whole batch with Triton's text; the worker survives
    ref0, data0 = fp32_frame("INPUT0", np.array([1.0]), 0)
    sup.send("w1", m.Execute(batch_id=9, requests=[
        m.RequestItem(request_id=4, id="", inputs=[ref0], requested_outputs=[]),
        m.RequestItem(request_id=5, id="", inputs=[ref0], requested_outputs=[], parameters='{"raise": true}'),
    ]), [data0])
    result, _ = sup.expect(m.ExecuteResult)
    for item in result.responses:
        assert item.error is not None and item.error.code == ErrorCode.INTERNAL
        assert item.error.message == (
            "Failed to process the request(s) for model 'demo_0_0', message: ValueError: boom")

    # a TritonError in one response stays with that request, with its code
    sup.send("w1", m.Execute(batch_id=10, requests=[
        m.RequestItem(request_id=6, id="", inputs=[ref0], requested_outputs=[], parameters='{"error": true}'),
        m.RequestItem(request_id=7, id="", inputs=[ref0], requested_outputs=[]),
    ]), [data0])
    result, frames = sup.expect(m.ExecuteResult)
    bad, good = result.responses
    assert bad.error is not None and bad.error.code == ErrorCode.INVALID_ARG and bad.error.message == "bad input"
    assert good.error is None
    np.testing.assert_array_equal(output(frames, good, "OUTPUT0"), [2.0])

    # an output datatype other than the declared one goes as the model made it (as Triton's Python backend)
    sup.send("w1", m.Execute(batch_id=11, requests=[
        m.RequestItem(request_id=8, id="", inputs=[ref0], requested_outputs=["OUTPUT0"],
                      parameters='{"wrong_dtype": true}')]), [data0])
    result, frames = sup.expect(m.ExecuteResult)
    assert result.responses[0].error is None
    [ref] = result.responses[0].outputs
    assert ref.datatype == "FP64"
    np.testing.assert_array_equal(output(frames, result.responses[0], "OUTPUT0"), [2.0])

    # a bad input (byte size does not match the shape) fails that request only
    sup.send("w1", m.Execute(batch_id=12, requests=[
        m.RequestItem(request_id=9, id="", inputs=[m.TensorRef("INPUT0", "FP32", [5], frame=0)],
                      requested_outputs=[]),
        m.RequestItem(request_id=10, id="", inputs=[ref0], requested_outputs=[])]), [data0])
    result, _ = sup.expect(m.ExecuteResult)
    assert result.responses[0].error.code == ErrorCode.INVALID_ARG
    assert result.responses[1].error is None

    assert rss_kib(proc.pid) > 0
    sup.ping("w1", 41)  # answered with its seq (the worker sends heartbeats only when asked)
    assert sup.heartbeats.get("w1/hb", 0) >= 1

    # Shutdown: finalize, Bye, exit 0
    sup.send("w1", m.Shutdown())
    bye, _ = sup.expect(m.Bye)
    assert bye.error is None
    assert proc.wait(timeout=5) == 0
    assert (model_dir / "finalized").read_text() == "yes"


def test_worker_main_scenario(sup, tmp_path):
    run_main_scenario(sup, tmp_path)


@pytest.mark.parametrize("python", EXTRA)
def test_worker_main_scenario_other_pythons(python, tmp_path):
    sup = FakeSupervisor(python)
    try:
        run_main_scenario(sup, tmp_path)
    finally:
        sup.close()


def test_stdin_eof_exits_within_a_second(sup):
    proc = sup.spawn("w2")
    sup.expect(m.Hello)
    t0 = time.monotonic()
    proc.stdin.close()
    assert proc.wait(timeout=1.0) == 4
    assert time.monotonic() - t0 < 1.0


def test_silent_supervisor_heartbeat_timeout(sup):
    proc = sup.spawn("w3", hb_interval=0.1, hb_timeout=0.4)
    sup.expect(m.Hello)
    assert proc.wait(timeout=3.0) == 4


def test_load_failure_and_bad_backend_keep_worker_alive(sup, tmp_path):
    model_dir = write_model(tmp_path, "broken", "class TritonPythonModel:\n"
                            "    def initialize(self, args):\n        raise RuntimeError('no weights')\n")
    proc = sup.spawn("w4")
    sup.expect(m.Hello)
    dict_load = load_msg(model_dir, dict(CONFIG, name="broken"))
    sup.send("w4", dict_load)
    loaded, _ = sup.expect(m.LoadResult)
    assert loaded.error is not None and loaded.error.message == "RuntimeError: no weights"
    dict_load.backend = "tensorflow"
    sup.send("w4", dict_load)
    loaded, _ = sup.expect(m.LoadResult)
    assert loaded.error is not None and loaded.error.code == ErrorCode.UNSUPPORTED
    sup.send("w4", m.Shutdown())
    sup.expect(m.Bye)
    assert proc.wait(timeout=5) == 0


def test_protocol_error_exits_nonzero(sup):
    proc = sup.spawn("w5")
    sup.expect(m.Hello)
    sup.router.send_multipart([b"w5", b'{"t": "no_such_message"}'])
    assert proc.wait(timeout=5) == 3


CANCEL_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not requests[0].is_cancelled():
            time.sleep(0.005)
        out = []
        for r in requests:
            if r.is_cancelled():
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(1, np.float32))]))
        return out
"""


ASYNC_CANCEL_MODEL = CANCEL_MODEL.replace("import time", "import asyncio\nimport time").replace(
    "def execute", "async def execute").replace("time.sleep(0.005)", "await asyncio.sleep(0.005)")


@pytest.mark.parametrize("source", [CANCEL_MODEL, ASYNC_CANCEL_MODEL], ids=["sync", "async"])
def test_cancel_reaches_a_running_execute(sup, tmp_path, source):
    model_dir = write_model(tmp_path, "slow", source)
    proc = sup.spawn("w6")
    sup.expect(m.Hello)
    sup.send("w6", load_msg(model_dir, dict(CONFIG, name="slow")))
    assert sup.expect(m.LoadResult)[0].error is None
    ref0, data0 = fp32_frame("INPUT0", np.array([1.0]), 0)
    sup.send("w6", m.Execute(batch_id=1, requests=[
        m.RequestItem(request_id=11, id="", inputs=[ref0], requested_outputs=[]),
        m.RequestItem(request_id=12, id="", inputs=[ref0], requested_outputs=[])]), [data0])
    sup.send("w6", m.Cancel(request_ids=[11]))
    sup.send("w6", m.Shutdown())  # queued behind the Execute, handled after it
    t0 = time.monotonic()
    result, _ = sup.expect(m.ExecuteResult)
    assert time.monotonic() - t0 < 5
    first, second = result.responses
    assert first.error is not None and first.error.code == ErrorCode.CANCELLED
    assert second.error is None
    sup.expect(m.Bye)
    assert proc.wait(timeout=5) == 0
