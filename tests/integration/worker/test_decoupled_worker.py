"""A real worker process serving a decoupled model, driven by a fake supervisor (raw ROUTER):
StreamResponses from other threads, Cancel reaching a streaming request while the execute thread is
busy with another batch, an exception in execute ending only the unfinished requests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode

from .workerharness import FakeSupervisor

WAIT_S = 30.0
CONFIG = {
    "name": "dec", "max_batch_size": 0, "backend": "python",
    "model_transaction_policy": {"decoupled": True},
    "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
}

MODEL = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def out(i):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = json.loads(request.parameters()).get("mode")
            sender = request.get_response_sender()
            if mode == "stream":  # a thread streams until the request is cancelled
                threading.Thread(target=self.stream, args=(request, sender), daemon=True).start()
            elif mode == "block":  # execute itself waits for cancellation
                deadline = time.monotonic() + 20
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.005)
                sender.send(out(-1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "two":
                sender.send(out(0))
                sender.send(out(1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "raise":
                sender.send(out(7))
                raise ValueError("broken")
        return None

    def stream(self, request, sender):
        i = 0
        while not sender.is_cancelled():
            sender.send(out(i))
            i += 1
            time.sleep(0.01)
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@pytest.fixture
def worker(tmp_path: Path):
    model_dir = tmp_path / "dec"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    sup = FakeSupervisor()
    proc = sup.spawn("d1")
    sup.expect(m.Hello)
    sup.send("d1", m.LoadModel(model_name="dec", model_dir=str(model_dir), version="1", config_json=json.dumps(CONFIG),
                               backend="python", instance_name="dec_0_0", instance_kind="CPU", device_id=0))
    assert sup.expect(m.LoadResult, WAIT_S)[0].error is None
    yield sup
    sup.send("d1", m.Shutdown())
    try:
        while not isinstance(sup.recv(WAIT_S)[1], m.Bye):
            pass
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        sup.close()


def execute(sup: FakeSupervisor, batch_id: int, modes: dict[int, str]) -> None:
    data = np.array([1], dtype="<i4").tobytes()
    items = [m.RequestItem(request_id=rid, id="r%d" % rid, inputs=[m.TensorRef("IN", "INT32", [1], frame=0, nbytes=4)],
                           requested_outputs=[], parameters=json.dumps({"mode": mode}))
             for rid, mode in modes.items()]
    sup.send("d1", m.Execute(batch_id=batch_id, requests=items), [data])


def value(msg: m.StreamResponse, frames: list) -> int:
    assert msg.response is not None and msg.response.error is None
    (ref,) = msg.response.outputs
    return int(np.frombuffer(frames[ref.frame].bytes, dtype="<i4")[0])


def test_responses_then_final_then_execute_result_in_order(worker):
    execute(worker, 1, {5: "two"})
    got = [worker.recv(WAIT_S)[1:] for _ in range(3)]
    (m0, f0), (m1, f1), (res, _) = got
    assert isinstance(m0, m.StreamResponse) and m0.request_id == 5 and not m0.final and value(m0, f0) == 0
    assert isinstance(m1, m.StreamResponse) and m1.final and value(m1, f1) == 1
    assert isinstance(res, m.ExecuteResult) and res.batch_id == 1
    assert [(r.request_id, r.error, r.outputs) for r in res.responses] == [(5, None, [])]


def test_cancel_reaches_a_streaming_request_while_another_batch_blocks(worker):
    execute(worker, 1, {1: "stream"})
    while True:  # execute returns at once; its thread streams on (responses may come first)
        _, msg, frames = worker.recv(WAIT_S)
        if isinstance(msg, m.ExecuteResult):
            break
        assert isinstance(msg, m.StreamResponse) and msg.request_id == 1 and not msg.final
    assert msg.responses[0].error is None
    execute(worker, 2, {2: "block"})  # occupies the execute thread until cancelled
    seen = 0
    while seen < 3:
        msg, frames = worker.expect(m.StreamResponse, WAIT_S)
        assert msg.request_id == 1
        seen += 1
    worker.send("d1", m.Cancel([1]))
    while True:  # the streaming thread sees is_cancelled() although execute is busy elsewhere
        msg, frames = worker.expect(m.StreamResponse, WAIT_S)
        if msg.final:
            break
    assert msg.request_id == 1 and msg.response.error.code == ErrorCode.CANCELLED
    worker.send("d1", m.Cancel([2]))
    msg, frames = worker.expect(m.StreamResponse, WAIT_S)
    assert msg.request_id == 2 and msg.final and value(msg, frames) == -1
    result, _ = worker.expect(m.ExecuteResult, WAIT_S)
    assert result.batch_id == 2 and result.responses[0].error is None


def test_exception_in_execute_fails_only_the_requests_without_final(worker):
    execute(worker, 1, {1: "two", 2: "raise"})
    msgs = []
    while True:
        _, msg, frames = worker.recv(WAIT_S)
        if isinstance(msg, m.ExecuteResult):
            break
        msgs.append((msg.request_id, value(msg, frames), msg.final))
    assert msgs == [(1, 0, False), (1, 1, True), (2, 7, False)]
    first, second = msg.responses
    assert first.error is None  # it had sent its final
    assert second.error.code == ErrorCode.INTERNAL
    assert second.error.message == ("Failed to process the request(s) for model 'dec_0_0', message: "
                                    "ValueError: broken")
