"""Golden bytes: the wire encoding of every supervisor<->worker message, pinned (docs/worker-protocol.md).

The literals were produced by the encoders as of WIRE_VERSION 8. A change here is a wire change: it
needs a WIRE_VERSION bump and a docs update, never a silent edit. Covers the generic encoder for every
message type (ExecuteResult and StreamResponse through the worker's writers, and without them), the
supervisor's hot-path Execute / ExecuteColumns headers (fields at their default left out, loc "cuda" refs
carrying device and owner; written with orjson and with the json fallback a worker environment without
orjson gets) and the worker's compact ExecuteResult / ExecuteResultColumns / StreamResponse writers; each
golden also decodes to the message it came from, with the generic decoder and with the fast ones.
"""

# ruff: noqa: E501

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from inferd.supervisor.inference.types import InferRequest, RequestedOutput
from inferd.supervisor.instances import results
from inferd.supervisor.instances.packing import request_item
from inferd.supervisor.tracing.record import Trace
from inferd.worker.wire import codec, writers
from inferd.worker.wire import messages as m


def _samples():
    ref = m.TensorRef("IN", "FP32", [2, 3], "frame", 1, "", 8, 24)
    shm = m.TensorRef("BIG", "UINT8", [1 << 17], "shm", -1, "inferd_7_3", 4096, 1 << 17)
    cuda = m.TensorRef("DEV", "FP16", [4], "cuda", -1, "ab" * 64, 256, 8, 1, "client:r\u00e9gion")
    err = m.WireError(3, 'bad "input" \u2603')
    item = m.RequestItem(11, "req-\u00e9", [ref, shm, cuda], ["OUT", "OUT2"], '{"p":1}', "seq-1", 3, 500,
                         True, "42")
    plain_item = m.RequestItem(12, "", [ref], [])
    response = m.ResponseItem(11, [ref, cuda], None, {"k": [1, "v"], "b": True})
    col = m.TensorColumn("X", "INT32", [1, 4], 0)
    return {
        "hello": m.Hello(m.WIRE_VERSION, 1234, "m_0", "3.9.18", "1.26.4", "25.1.2"),
        "autocomplete_result": m.AutoCompleteResult('{"name":"m"}', None),
        "autocomplete_result_error": m.AutoCompleteResult("", err),
        "load_result": m.LoadResult(None, "python", True),
        "execute_result": m.ExecuteResult(7, [response, m.ResponseItem(12, [], err, {})], 10, 20, 30),
        "execute_result_columns": m.ExecuteResultColumns(8, [1, 2, 3], [col, m.TensorColumn("Y", "FP64", [3], 1)],
                                                        1, 2, 3),
        "stream_response": m.StreamResponse(5, False, response),
        "stream_response_final": m.StreamResponse(5, True, None),
        "log": m.Log("WARNING", "careful \u00e9"),
        "bye": m.Bye(err),
        "autocomplete": m.AutoComplete("m", "/repo/m", "1", "{}", "python", "/backends/toy"),
        "load_model": m.LoadModel("m", "/repo/m", "1", '{"name":"m"}', "python", "m_0", "GPU", 1, "/backends/toy"),
        "execute": m.Execute(9, [item, plain_item], ["inferd_1_9"]),
        "execute_columns": m.ExecuteColumns(10, [1, 2], [col], ["a", "b"], ["OUT"], ["inferd_1_1"]),
        "cancel": m.Cancel([1, 2]),
        "release_outputs": m.ReleaseOutputs(["inferd_2_1"], ["%s:256" % ("ab" * 64)]),
        "shutdown": m.Shutdown(),
        "log_settings": m.LogSettings(2, True, False, True),
        "attach": m.Attach("ipc:///run/inferd/fe-1.sock"),
        "heartbeat": m.Heartbeat(77),
        "bls_request": m.BlsRequest(3, "other", "2", "rid", [ref, shm, cuda], ["OUT"], 9, 1, 100, '{"a":2}',
                                    True, True, "42"),
        "bls_response": m.BlsResponse(3, [ref, cuda], [0, 17], None, {"x": 1}, False),
        "bls_response_error": m.BlsResponse(3, [], [], err, {}, True),
        "bls_cancel": m.BlsCancel(3),
        "bls_release": m.BlsRelease([17, 18]),
        "model_control": m.ModelControl(4, "load", "m2", "1", '{"x":1}', ["config.pbtxt"], True),
        "model_control_result": m.ModelControlResult(4, None, True),
        "metrics_report": m.MetricsReport(True, "model 'm' instance 'm_0'", [[1, "fam", "desc", "counter"]],
                                          [[1, 1, {"l": "v"}, None]], [[1, 5.5]], [2]),
        "metrics_report_acked": m.MetricsReport(False, "", [], [], [[1, 2.0]], [], 3),
        "metrics_ack": m.MetricsAck(3),
        "readiness_probe": m.ReadinessProbe(5),
        "readiness_result": m.ReadinessResult(5, True, None),
        "readiness_result_error": m.ReadinessResult(6, False, err),
    }

def _fast():
    req = InferRequest("m", id="abc", outputs=[RequestedOutput("OUT")], parameters={"p": 1},
                       correlation_id="seq-1", flags=3, timeout_us=5, device_outputs=True)
    req.trace = Trace(42, "m", "1", "abc", None, False, lambda t: None)
    plain = InferRequest("m", outputs=[])
    refs = [m.tensor_ref("IN", "FP32", (2,), "frame", 0, "", 0, 8),
            m.tensor_ref("S", "UINT8", [1 << 17], "shm", -1, "inferd_7_3", 64, 1 << 17),
            m.tensor_ref("BIG", "INT8", [1 << 20], "cuda", -1, "ab" * 64, 0, 1 << 20, 1, "p_0")]
    items = [request_item(11, req, refs), request_item(12, plain, refs[:1])]
    utf8 = InferRequest("m", id="r\u00e9q \"1\"", outputs=[RequestedOutput("\u2603")], correlation_id=1 << 63)
    frame_ref = m.output_ref_json("OUT", "FP32", (1, 4), 0, 16, 16)
    list_ref = m.output_ref_json("OUT\u00e9", "BYTES", [2], 1, 0, 12)
    shm_ref = m.output_shm_ref_json("BIG", "UINT8", (1 << 17,), "inferd_3_1", 1 << 17)
    dev_ref = m.device_ref_json("DEV", "FP16", (4,), "cd" * 64, 512, 8, 1, "m_0")
    item = m.response_item_json(11, [frame_ref, list_ref, shm_ref, dev_ref], None, {"k": "v"})
    failed = m.response_item_json(12, (), m.WireError(13, 'no "way"'))
    return {
        "sup_execute": m.execute_header(7, items, ["inferd_1_9"]),
        "sup_execute_utf8": m.execute_header(
            3, [request_item(1, utf8, [m.tensor_ref("\u00e9", "BYTES", [], "frame", 1, "", 0, 0)])], []),
        "sup_execute_columns": m.execute_columns_header(8, [1, 2], [("X", "INT32", (1, 4))], ["a", "b"], ["OUT"],
                                                        ["inferd_1_1"]),
        "sup_execute_columns_plain": m.execute_columns_header(8, [1, 2], [("X", "INT32", [1, 4]), ("Y", "FP64", [])],
                                                              ["", ""], [], []),
        "wrk_execute_result": m.execute_result_header(9, [item, failed], 1, 2, 3),
        "wrk_execute_result_empty": m.execute_result_header(9, []),
        "wrk_execute_result_columns": m.execute_result_columns_header(
            10, [1, 2], [("X", "INT32", (1, 4)), ("Y", "FP64", [3])], 4, 5, 6),
        "wrk_stream_response": m.stream_response_header(5, False, item),
        "wrk_stream_response_flag": m.stream_response_header(5, True, None),
    }


GOLDEN = {
    'hello': b'{"wire_version":8,"pid":1234,"instance_name":"m_0","python_version":"3.9.18","numpy_version":"1.26.4","zmq_version":"25.1.2","t":"hello"}',
    'autocomplete_result': b'{"config_json":"{\\"name\\":\\"m\\"}","error":null,"t":"autocomplete_result"}',
    'autocomplete_result_error': b'{"config_json":"","error":{"code":3,"message":"bad \\"input\\" \\u2603"},"t":"autocomplete_result"}',
    'load_result': b'{"error":null,"backend":"python","readiness":true,"t":"load_result"}',
    'execute_result': b'{"batch_id":7,"responses":[{"request_id":11,"outputs":[{"name":"IN","datatype":"FP32","shape":[2,3],"loc":"frame","frame":1,"region":"","offset":8,"nbytes":24,"device":0,"owner":""},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","frame":-1,"region":"abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab","offset":256,"nbytes":8,"device":1,"owner":"client:r\\u00e9gion"}],"error":null,"parameters":{"k":[1,"v"],"b":true}},{"request_id":12,"outputs":[],"error":{"code":3,"message":"bad \\"input\\" \\u2603"},"parameters":{}}],"compute_input_ns":10,"compute_infer_ns":20,"compute_output_ns":30,"t":"execute_result"}',
    'execute_result_columns': b'{"batch_id":8,"request_ids":[1,2,3],"outputs":[{"name":"X","datatype":"INT32","shape":[1,4],"frame":0},{"name":"Y","datatype":"FP64","shape":[3],"frame":1}],"compute_input_ns":1,"compute_infer_ns":2,"compute_output_ns":3,"t":"execute_result_columns"}',
    'stream_response': b'{"request_id":5,"final":false,"response":{"request_id":11,"outputs":[{"name":"IN","datatype":"FP32","shape":[2,3],"loc":"frame","frame":1,"region":"","offset":8,"nbytes":24,"device":0,"owner":""},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","frame":-1,"region":"abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab","offset":256,"nbytes":8,"device":1,"owner":"client:r\\u00e9gion"}],"error":null,"parameters":{"k":[1,"v"],"b":true}},"t":"stream_response"}',
    'stream_response_final': b'{"request_id":5,"final":true,"response":null,"t":"stream_response"}',
    'log': b'{"level":"WARNING","message":"careful \\u00e9","t":"log"}',
    'bye': b'{"error":{"code":3,"message":"bad \\"input\\" \\u2603"},"t":"bye"}',
    'autocomplete': b'{"model_name":"m","model_dir":"/repo/m","version":"1","config_json":"{}","backend":"python","backend_dir":"/backends/toy","t":"autocomplete"}',
    'load_model': b'{"model_name":"m","model_dir":"/repo/m","version":"1","config_json":"{\\"name\\":\\"m\\"}","backend":"python","instance_name":"m_0","instance_kind":"GPU","device_id":1,"backend_dir":"/backends/toy","t":"load_model"}',
    'execute': b'{"batch_id":9,"requests":[{"request_id":11,"id":"req-\\u00e9","inputs":[{"name":"IN","datatype":"FP32","shape":[2,3],"loc":"frame","frame":1,"region":"","offset":8,"nbytes":24,"device":0,"owner":""},{"name":"BIG","datatype":"UINT8","shape":[131072],"loc":"shm","frame":-1,"region":"inferd_7_3","offset":4096,"nbytes":131072,"device":0,"owner":""},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","frame":-1,"region":"abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab","offset":256,"nbytes":8,"device":1,"owner":"client:r\\u00e9gion"}],"requested_outputs":["OUT","OUT2"],"parameters":"{\\"p\\":1}","correlation_id":"seq-1","flags":3,"timeout_us":500,"device_outputs":true,"trace":"42"},{"request_id":12,"id":"","inputs":[{"name":"IN","datatype":"FP32","shape":[2,3],"loc":"frame","frame":1,"region":"","offset":8,"nbytes":24,"device":0,"owner":""}],"requested_outputs":[],"parameters":"{}","correlation_id":0,"flags":0,"timeout_us":0,"device_outputs":false,"trace":""}],"forget_regions":["inferd_1_9"],"poll_us":0,"t":"execute"}',
    'execute_columns': b'{"batch_id":10,"request_ids":[1,2],"inputs":[{"name":"X","datatype":"INT32","shape":[1,4],"frame":0}],"ids":["a","b"],"requested_outputs":["OUT"],"forget_regions":["inferd_1_1"],"poll_us":0,"t":"execute_columns"}',
    'cancel': b'{"request_ids":[1,2],"t":"cancel"}',
    'release_outputs': b'{"regions":["inferd_2_1"],"device":["abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab:256"],"t":"release_outputs"}',
    'shutdown': b'{"t":"shutdown"}',
    'log_settings': b'{"verbose":2,"info":true,"warning":false,"errors":true,"t":"log_settings"}',
    'attach': b'{"endpoint":"ipc:///run/inferd/fe-1.sock","t":"attach"}',
    'heartbeat': b'{"seq":77,"t":"heartbeat"}',
    'bls_request': b'{"call_id":3,"model_name":"other","model_version":"2","request_id":"rid","inputs":[{"name":"IN","datatype":"FP32","shape":[2,3],"loc":"frame","frame":1,"region":"","offset":8,"nbytes":24,"device":0,"owner":""},{"name":"BIG","datatype":"UINT8","shape":[131072],"loc":"shm","frame":-1,"region":"inferd_7_3","offset":4096,"nbytes":131072,"device":0,"owner":""},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","frame":-1,"region":"abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab","offset":256,"nbytes":8,"device":1,"owner":"client:r\\u00e9gion"}],"requested_outputs":["OUT"],"correlation_id":9,"flags":1,"timeout_us":100,"parameters":"{\\"a\\":2}","decoupled":true,"device_outputs":true,"trace":"42","t":"bls_request"}',
    'bls_response': b'{"call_id":3,"outputs":[{"name":"IN","datatype":"FP32","shape":[2,3],"loc":"frame","frame":1,"region":"","offset":8,"nbytes":24,"device":0,"owner":""},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","frame":-1,"region":"abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab","offset":256,"nbytes":8,"device":1,"owner":"client:r\\u00e9gion"}],"leases":[0,17],"error":null,"parameters":{"x":1},"final":false,"t":"bls_response"}',
    'bls_response_error': b'{"call_id":3,"outputs":[],"leases":[],"error":{"code":3,"message":"bad \\"input\\" \\u2603"},"parameters":{},"final":true,"t":"bls_response"}',
    'bls_cancel': b'{"call_id":3,"t":"bls_cancel"}',
    'bls_release': b'{"lease_ids":[17,18],"t":"bls_release"}',
    'model_control': b'{"call_id":4,"op":"load","model_name":"m2","model_version":"1","config":"{\\"x\\":1}","files":["config.pbtxt"],"unload_dependents":true,"t":"model_control"}',
    'model_control_result': b'{"call_id":4,"error":null,"ready":true,"t":"model_control_result"}',
    'metrics_report': b'{"full":true,"source":"model \'m\' instance \'m_0\'","families":[[1,"fam","desc","counter"]],"metrics":[[1,1,{"l":"v"},null]],"values":[[1,5.5]],"dropped":[2],"ack":0,"t":"metrics_report"}',
    'metrics_report_acked': b'{"full":false,"source":"","families":[],"metrics":[],"values":[[1,2.0]],"dropped":[],"ack":3,"t":"metrics_report"}',
    'metrics_ack': b'{"seq":3,"t":"metrics_ack"}',
    'readiness_probe': b'{"seq":5,"t":"readiness_probe"}',
    'readiness_result': b'{"seq":5,"ready":true,"error":null,"t":"readiness_result"}',
    'readiness_result_error': b'{"seq":6,"ready":false,"error":{"code":3,"message":"bad \\"input\\" \\u2603"},"t":"readiness_result"}',
}

GOLDEN_FAST = {
    'sup_execute': b'{"batch_id":7,"requests":[{"request_id":11,"id":"abc","inputs":[{"name":"IN","datatype":"FP32","shape":[2],"frame":0,"offset":0,"nbytes":8},{"name":"S","datatype":"UINT8","shape":[131072],"loc":"shm","frame":-1,"region":"inferd_7_3","offset":64,"nbytes":131072},{"name":"BIG","datatype":"INT8","shape":[1048576],"loc":"cuda","frame":-1,"region":"abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab","offset":0,"nbytes":1048576,"device":1,"owner":"p_0"}],"requested_outputs":["OUT"],"parameters":"{\\"p\\": 1}","correlation_id":"seq-1","flags":3,"timeout_us":5,"device_outputs":true,"trace":"42"},{"request_id":12,"id":"","inputs":[{"name":"IN","datatype":"FP32","shape":[2],"frame":0,"offset":0,"nbytes":8}],"requested_outputs":[]}],"forget_regions":["inferd_1_9"],"poll_us":0,"t":"execute"}',
    'sup_execute_utf8': b'{"batch_id":3,"requests":[{"request_id":1,"id":"r\xc3\xa9q \\"1\\"","inputs":[{"name":"\xc3\xa9","datatype":"BYTES","shape":[],"frame":1,"offset":0,"nbytes":0}],"requested_outputs":["\xe2\x98\x83"],"correlation_id":9223372036854775808}],"forget_regions":[],"poll_us":0,"t":"execute"}',  # UTF-8 as is (orjson's way)
    'sup_execute_columns_plain': b'{"batch_id":8,"request_ids":[1,2],"inputs":[{"name":"X","datatype":"INT32","shape":[1,4],"frame":0},{"name":"Y","datatype":"FP64","shape":[],"frame":1}],"forget_regions":[],"t":"execute_columns"}',
    'sup_execute_columns': b'{"batch_id":8,"request_ids":[1,2],"inputs":[{"name":"X","datatype":"INT32","shape":[1,4],"frame":0}],"ids":["a","b"],"requested_outputs":["OUT"],"forget_regions":["inferd_1_1"],"t":"execute_columns"}',
    'wrk_execute_result': b'{"batch_id":9,"responses":[{"request_id":11,"outputs":[{"name":"OUT","datatype":"FP32","shape":[1,4],"frame":0,"offset":16,"nbytes":16},{"name":"OUT\\u00e9","datatype":"BYTES","shape":[2],"frame":1,"offset":0,"nbytes":12},{"name":"BIG","datatype":"UINT8","shape":[131072],"loc":"shm","region":"inferd_3_1","offset":0,"nbytes":131072},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","region":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","offset":512,"nbytes":8,"device":1,"owner":"m_0"}],"parameters":{"k":"v"}},{"request_id":12,"outputs":[],"error":{"code":13,"message":"no \\"way\\""}}],"compute_input_ns":1,"compute_infer_ns":2,"compute_output_ns":3,"t":"execute_result"}',
    'wrk_execute_result_empty': b'{"batch_id":9,"responses":[],"compute_input_ns":0,"compute_infer_ns":0,"compute_output_ns":0,"t":"execute_result"}',
    'wrk_execute_result_columns': b'{"batch_id":10,"request_ids":[1,2],"outputs":[{"name":"X","datatype":"INT32","shape":[1,4],"frame":0},{"name":"Y","datatype":"FP64","shape":[3],"frame":1}],"compute_input_ns":4,"compute_infer_ns":5,"compute_output_ns":6,"t":"execute_result_columns"}',
    'wrk_stream_response': b'{"request_id":5,"final":false,"response":{"request_id":11,"outputs":[{"name":"OUT","datatype":"FP32","shape":[1,4],"frame":0,"offset":16,"nbytes":16},{"name":"OUT\\u00e9","datatype":"BYTES","shape":[2],"frame":1,"offset":0,"nbytes":12},{"name":"BIG","datatype":"UINT8","shape":[131072],"loc":"shm","region":"inferd_3_1","offset":0,"nbytes":131072},{"name":"DEV","datatype":"FP16","shape":[4],"loc":"cuda","region":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","offset":512,"nbytes":8,"device":1,"owner":"m_0"}],"parameters":{"k":"v"}},"t":"stream_response"}',
    'wrk_stream_response_flag': b'{"request_id":5,"final":true,"response":null,"t":"stream_response"}',
}


def test_wire_version_is_pinned():
    assert m.WIRE_VERSION == 8


def test_every_message_type_has_a_golden():
    tags = {name.rsplit("_error", 1)[0] if name.endswith("_error") else name for name in GOLDEN}
    tags = {t[: -len("_final")] if t.endswith("_final") else t for t in tags}
    tags = {t[: -len("_acked")] if t.endswith("_acked") else t for t in tags}
    assert tags == set(m.MESSAGE_TYPES)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_generic_encoding_is_pinned(name):
    message = _samples()[name]
    assert m.encode_header(message) == GOLDEN[name]
    assert m.encode(message, [b"x"]) == [GOLDEN[name], b"x"]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_decodes_to_its_message(name):
    message, data = m.decode([GOLDEN[name], b"x"])
    assert message == _samples()[name]
    assert list(data) == [b"x"]


@pytest.mark.parametrize("name", sorted(GOLDEN_FAST))
def test_hot_path_encoding_is_pinned(name):
    assert _fast()[name] == GOLDEN_FAST[name]


def test_supervisor_execute_decodes_with_defaults_filled_in():
    message, _ = m.decode([GOLDEN_FAST["sup_execute"]])
    assert type(message) is m.Execute
    first, second = message.requests
    assert first.inputs[0] == m.TensorRef("IN", "FP32", [2], "frame", 0, "", 0, 8)
    assert first.inputs[1] == m.TensorRef("S", "UINT8", [1 << 17], "shm", -1, "inferd_7_3", 64, 1 << 17)
    assert first.inputs[2] == m.TensorRef("BIG", "INT8", [1 << 20], "cuda", -1, "ab" * 64, 0, 1 << 20, 1, "p_0")
    assert (first.parameters, first.correlation_id, first.flags, first.timeout_us, first.device_outputs,
            first.trace) == ('{"p": 1}', "seq-1", 3, 5, True, "42")
    assert (second.parameters, second.correlation_id, second.flags, second.timeout_us, second.device_outputs,
            second.trace) == ("{}", 0, 0, 0, False, "")
    assert message.forget_regions == ["inferd_1_9"]


def test_worker_result_headers_decode_to_messages():
    message, _ = m.decode([GOLDEN_FAST["wrk_execute_result"]])
    assert type(message) is m.ExecuteResult
    ok, failed = message.responses
    assert ok.outputs[2] == m.TensorRef("BIG", "UINT8", [1 << 17], "shm", -1, "inferd_3_1", 0, 1 << 17)
    assert ok.outputs[3] == m.TensorRef("DEV", "FP16", [4], "cuda", -1, "cd" * 64, 512, 8, 1, "m_0")
    assert ok.parameters == {"k": "v"} and ok.error is None
    assert failed == m.ResponseItem(12, [], m.WireError(13, 'no "way"'), {})
    assert (message.compute_input_ns, message.compute_infer_ns, message.compute_output_ns) == (1, 2, 3)
    stream, _ = m.decode([GOLDEN_FAST["wrk_stream_response"]])
    assert stream.request_id == 5 and stream.final is False and stream.response == ok
    columns, _ = m.decode([GOLDEN_FAST["wrk_execute_result_columns"]])
    assert columns == m.ExecuteResultColumns(10, [1, 2], [m.TensorColumn("X", "INT32", [1, 4], 0),
                                                          m.TensorColumn("Y", "FP64", [3], 1)], 4, 5, 6)


def test_execute_writer_without_orjson_gives_the_same_bytes(monkeypatch):
    """A worker environment may lack orjson: the json fallback writes the same Execute headers."""
    monkeypatch.setattr(writers, "_dumpb", writers._dumpb_json)
    for name in ("sup_execute", "sup_execute_utf8", "sup_execute_columns", "sup_execute_columns_plain"):
        assert _fast()[name] == GOLDEN_FAST[name], name


def test_result_columns_writer_without_orjson_gives_the_same_bytes(monkeypatch):
    """The request ids of an ExecuteResultColumns: orjson's text where installed, str()'s without; the same."""
    monkeypatch.setattr(writers, "_int_list", writers._int_list_text)
    assert _fast()["wrk_execute_result_columns"] == GOLDEN_FAST["wrk_execute_result_columns"]
    ids = [0, 1, 2 ** 63 - 1, 2 ** 64, -(2 ** 63), 7]  # (beyond 64 bits: orjson refuses, str() writes it)
    assert writers._int_list_orjson(ids) == writers._int_list_text(ids) == json.dumps(ids, separators=(",", ":"))
    assert writers._int_list_orjson(list(range(40))) == json.dumps(list(range(40)), separators=(",", ":"))


@pytest.mark.parametrize("name", ["execute_result", "stream_response", "stream_response_final"])
def test_result_objects_take_the_writer_and_the_generic_path_alike(name, monkeypatch):
    """encode_header writes an ExecuteResult / StreamResponse with the worker's writers (every field);
    without them (the generic path) the bytes are the same."""
    message = _samples()[name]
    assert type(message) in writers.OBJECT_WRITERS
    assert writers.OBJECT_WRITERS[type(message)](message) == GOLDEN[name]
    monkeypatch.setattr(codec, "OBJECT_WRITERS", {})  # what encode_header consults
    assert m.encode_header(message) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GOLDEN) + sorted(GOLDEN_FAST))
def test_supervisor_decodes_every_golden_like_the_generic_decoder(name):
    """The supervisor's decode (orjson, fast result decoders) gives what the generic decoder gives."""
    raw = GOLDEN.get(name) or GOLDEN_FAST[name]
    header = json.loads(raw)
    expected = codec._build(m.MESSAGE_TYPES[header.pop("t")], header)
    message, data = results.decode([memoryview(raw), b"x"])
    assert message == expected and repr(message) == repr(expected)
    assert type(message) is type(expected) and list(data) == [b"x"]
    worker_side, _ = m.decode([raw])
    assert worker_side == expected


def test_supervisor_decodes_results_as_messages():
    message, _ = results.decode([GOLDEN_FAST["wrk_execute_result"]])
    assert type(message) is m.ExecuteResult
    ok, failed = message.responses
    assert type(ok) is m.ResponseItem and type(ok.outputs[0]) is m.TensorRef and ok.error is None
    assert type(failed.error) is m.WireError and failed.parameters == {} and failed.outputs == []
    columns, _ = results.decode([GOLDEN_FAST["wrk_execute_result_columns"]])
    assert type(columns) is m.ExecuteResultColumns and type(columns.outputs[1]) is m.TensorColumn
    message, _ = results.decode([GOLDEN["log_settings"]])
    assert message == m.LogSettings(2, True, False, True)


def test_the_wire_package_works_without_orjson():
    """A worker environment has only the standard library, numpy and pyzmq."""
    script = ("import sys; sys.modules['orjson'] = None\n"
              "from inferd.worker.wire import messages as m, writers\n"
              "assert writers._dumpb is writers._dumpb_json\n"
              "sys.stdout.buffer.write(m.execute_columns_header(8, [1, 2], [('X', 'INT32', (1, 4))], ['a', 'b'],"
              " ['OUT'], ['inferd_1_1']))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=True).stdout
    assert out == GOLDEN_FAST["sup_execute_columns"]
