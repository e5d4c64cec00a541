"""pb_utils.InferenceResponseSender for decoupled models (Triton's rules and messages), and the
StreamResponse wire message."""

from __future__ import annotations

import threading

import pytest
from inferd.worker.compat import load_pb_utils
from inferd.worker.wire import messages as m

pb = load_pb_utils()
FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def streaming_request():
    sent = []
    req = pb.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    req._stream = lambda response, final: sent.append((response, final))
    return req, sent


def test_any_number_of_responses_then_final_closes():
    req, sent = streaming_request()
    sender = req.get_response_sender()
    responses = [pb.InferenceResponse() for _ in range(3)]
    for r in responses:
        sender.send(r)
    sender.send(flags=FINAL)
    assert sent == [(r, False) for r in responses] + [(None, True)]
    with pytest.raises(pb.TritonModelException, match=r"^Unable to send response\. Response sender has been closed\.$"):
        sender.send(pb.InferenceResponse())
    assert len(sent) == 4


def test_send_rules_and_messages():
    req, sent = streaming_request()
    sender = req.get_response_sender()
    with pytest.raises(pb.TritonModelException, match="Inference Response object must be provided when the "
                                                      "response flags is set to zero."):
        sender.send()
    with pytest.raises(pb.TritonModelException, match="Unsupported flag provided"):
        sender.send(pb.InferenceResponse(), flags=4)
    with pytest.raises(TypeError):
        sender.send("not a response")
    sender.send(pb.InferenceResponse(), flags=FINAL)  # a data response that is also the final one
    assert sent and sent[-1][1] is True and sender.closed
    assert not sender._close()  # already closed


def test_non_decoupled_sender_rules():
    req = pb.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    sender = req.get_response_sender()
    with pytest.raises(pb.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=FINAL)
    sender.send(pb.InferenceResponse())
    with pytest.raises(pb.TritonModelException, match="Non-decoupled model cannot send more than one response"):
        sender.send(pb.InferenceResponse())


def test_sends_from_many_threads_keep_per_thread_order():
    req, sent = streaming_request()
    sender = req.get_response_sender()
    per_thread = 200
    made: dict[int, list] = {}

    def run(t: int) -> None:
        made[t] = [pb.InferenceResponse(parameters={"t": t, "i": i}) for i in range(per_thread)]
        for r in made[t]:
            sender.send(r)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sender.send(flags=FINAL)
    assert len(sent) == 4 * per_thread + 1
    for responses in made.values():
        mine = [r for r, _ in sent if r is not None and r in responses]
        assert mine == responses


def test_stream_response_round_trip():
    msg = m.StreamResponse(7, False, m.ResponseItem(7, [m.TensorRef("OUT", "INT32", [1], frame=0, nbytes=4)],
                                                    None, {"p": 1}))
    frames = m.encode(msg, [b"\x01\x00\x00\x00"])
    back, data = m.decode(frames)
    assert back == msg and bytes(data[0]) == b"\x01\x00\x00\x00"
    final = m.StreamResponse(7, True, None)
    assert m.decode(m.encode(final))[0] == final
    err = m.StreamResponse(8, True, m.ResponseItem(8, [], m.WireError(7, "cancelled")))
    assert m.decode(m.encode(err))[0] == err
    with pytest.raises(m.ProtocolError):
        m.decode([b'{"t":"stream_response","request_id":1,"response":{"bogus":1}}'])
