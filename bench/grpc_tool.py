"""gRPC side of the benchmark, run as its own process (it imports tritonclient's generated protos,
which must never share a process with a server's own copy of the KServe proto).

    grpc_tool.py build  --out-dir DIR        # write the h2load request bodies (gRPC framed) + index.json
    grpc_tool.py sanity --url HOST:PORT --out-dir DIR
        # send the exact same bytes with a raw gRPC unary call, check grpc-status and the outputs,
        # record the serialized response size (what h2load's data bytes are checked against), then
        # one ordinary tritonclient.grpc infer call per model.

Both print one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2

METHOD = "/inference.GRPCInferenceService/ModelInfer"
IDENTITY_ELEMS = 1 << 20  # 4 MiB of FP32


def add_sub_inputs() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)


def identity_input() -> np.ndarray:
    return (np.arange(IDENTITY_ELEMS, dtype=np.float32) % 1009.0) * 0.5


def requests() -> dict[str, service_pb2.ModelInferRequest]:
    a, b = add_sub_inputs()
    add_sub = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = add_sub.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(16)
    add_sub.raw_input_contents.extend([a.tobytes(), b.tobytes()])

    x = identity_input()
    ident = service_pb2.ModelInferRequest(model_name="identity_4mib")
    t = ident.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.append(IDENTITY_ELEMS)
    ident.raw_input_contents.append(x.tobytes())
    return {"add_sub": add_sub, "identity_4mib": ident}


def expected_outputs(model: str) -> dict[str, np.ndarray]:
    if model == "add_sub":
        a, b = add_sub_inputs()
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}
    return {"OUTPUT0": identity_input()}


def build(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    index = {}
    for model, req in requests().items():
        msg = req.SerializeToString()
        path = out_dir / f"{model}.grpc"
        path.write_bytes(b"\x00" + struct.pack(">I", len(msg)) + msg)
        payload = sum(len(c) for c in req.raw_input_contents)
        index[model] = {"path": str(path), "message_bytes": len(msg), "framed_bytes": len(msg) + 5,
                        "payload_bytes": payload}
    (out_dir / "index.json").write_text(json.dumps(index, indent=1))
    return index


def _decode_outputs(resp: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    out = {}
    for i, o in enumerate(resp.outputs):
        if i < len(resp.raw_output_contents):
            out[o.name] = np.frombuffer(resp.raw_output_contents[i], dtype=np.float32)
        else:  # typed contents (MLServer answers this way)
            out[o.name] = np.asarray(o.contents.fp32_contents, dtype=np.float32)
    return out


def sanity(url: str, out_dir: Path) -> dict:
    import grpc
    import tritonclient.grpc as tc

    index = json.loads((out_dir / "index.json").read_text())
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    result: dict = {}
    with grpc.insecure_channel(url, options=opts) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        for model, info in index.items():
            r: dict = {"ok": False}
            result[model] = r
            body = Path(info["path"]).read_bytes()[5:]
            try:
                raw = call(body, timeout=60)
            except grpc.RpcError as e:
                r["error"] = f"raw call: {e.code().name}: {e.details()}"
                continue
            r["response_bytes"] = len(raw)
            r["response_framed_bytes"] = len(raw) + 5
            resp = service_pb2.ModelInferResponse.FromString(raw)
            got = _decode_outputs(resp)
            bad = [k for k, v in expected_outputs(model).items()
                   if k not in got or got[k].shape != v.shape or not np.array_equal(got[k], v)]
            if bad:
                r["error"] = f"raw call: wrong outputs {bad}"
                continue
            r["ok"] = True

    # the ordinary client path too, so a server that only works for hand-built bytes is caught
    client = tc.InferenceServerClient(url)
    try:
        for model in index:
            want = expected_outputs(model)
            if model == "add_sub":
                a, b = add_sub_inputs()
                ins = [tc.InferInput("INPUT0", [16], "FP32"), tc.InferInput("INPUT1", [16], "FP32")]
                ins[0].set_data_from_numpy(a)
                ins[1].set_data_from_numpy(b)
            else:
                x = identity_input()
                ins = [tc.InferInput("INPUT0", [IDENTITY_ELEMS], "FP32")]
                ins[0].set_data_from_numpy(x)
            try:
                res = client.infer(model, ins, client_timeout=60)
                ok = all(np.array_equal(res.as_numpy(k).reshape(-1), v) for k, v in want.items())
                result[model]["tritonclient_ok"] = bool(ok)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                result[model]["tritonclient_ok"] = False
                result[model]["tritonclient_error"] = str(e)[:300]
    finally:
        client.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["build", "sanity"])
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--url")
    a = ap.parse_args()
    out = build(a.out_dir) if a.cmd == "build" else sanity(a.url, a.out_dir)
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
