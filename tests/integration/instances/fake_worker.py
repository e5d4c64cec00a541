"""A minimal worker speaking docs/worker-protocol.md, for supervisor-side unit tests.

Echoes every input as an output of the same name (prefixed "OUT_"); request parameter "sleep" (seconds)
delays the reply; "exit" makes it os._exit(int). FAKE_MODE (environment): "" normal, "bad_version"
(Hello with wire version 99), "no_hello", "load_fail", "no_heartbeat".
"""

import ctypes
import json
import os
import sys
import threading
import time

import zmq
from inferd.worker.wire import messages as m
from inferd.worker.wire import shm


def main() -> None:
    boot = json.loads(sys.stdin.buffer.readline())
    try:
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:
        pass
    if os.getppid() != boot["supervisor_pid"]:
        os._exit(1)
    mode = os.environ.get("FAKE_MODE", "")

    def lifeline() -> None:
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=lifeline, daemon=True).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, boot["identity"].encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(boot["endpoint"])

    def heartbeats() -> None:
        hb = ctx.socket(zmq.DEALER)
        hb.setsockopt(zmq.IDENTITY, (boot["identity"] + "/hb").encode())
        hb.setsockopt(zmq.LINGER, 0)
        hb.connect(boot["endpoint"])
        seq = 0
        while True:
            seq += 1
            if mode != "no_heartbeat":
                hb.send_multipart(m.encode(m.Heartbeat(seq)))
            while hb.poll(0):
                hb.recv_multipart()
            time.sleep(boot["heartbeat_interval_s"])

    threading.Thread(target=heartbeats, daemon=True).start()
    if mode == "no_hello":
        time.sleep(3600)
    version = 99 if mode == "bad_version" else m.WIRE_VERSION
    sock.send_multipart(m.encode(m.Hello(version, os.getpid(), boot["instance_name"], sys.version.split()[0],
                                         "0", zmq.zmq_version())))
    regions = {}
    while True:
        msg, data = m.decode(sock.recv_multipart(copy=False))
        if isinstance(msg, m.LoadModel):
            err = m.WireError(1, "fake load failure") if mode == "load_fail" else None
            sock.send_multipart(m.encode(m.LoadResult(err, "fake")))
        elif isinstance(msg, m.AutoComplete):
            sock.send_multipart(m.encode(m.AutoCompleteResult(msg.config_json.replace("{}", '{"done":1}'))))
        elif isinstance(msg, m.Execute):
            for name in msg.forget_regions:
                regions.pop(name, None)
            frames = []
            responses = []
            for item in msg.requests:
                params = json.loads(item.parameters)
                if "sleep" in params:
                    time.sleep(params["sleep"])
                if "exit" in params:
                    os._exit(params["exit"])
                outs = []
                for ref in item.inputs:
                    if ref.loc == "frame":  # small inputs share a frame: ours is [offset, offset + nbytes)
                        buf = data[ref.frame].buffer[ref.offset : ref.offset + ref.nbytes]
                    else:
                        if ref.region not in regions:
                            regions[ref.region] = shm.attach(ref.region, readonly=True)
                        buf = regions[ref.region].buf[ref.offset : ref.offset + ref.nbytes]
                        buf = bytes(buf)
                    outs.append(m.TensorRef("OUT_" + ref.name, ref.datatype, ref.shape, "frame", len(frames)))
                    frames.append(buf)
                responses.append(m.ResponseItem(item.request_id, outs, parameters={"seen": len(regions)}))
            reply = m.encode(m.ExecuteResult(msg.batch_id, responses, 1, 2, 3), frames)
            sock.send_multipart(reply, copy=False)
        elif isinstance(msg, m.Shutdown):
            sock.send_multipart(m.encode(m.Bye()))
            sock.close(linger=1000)
            os._exit(0)


if __name__ == "__main__":
    main()
