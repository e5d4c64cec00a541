"""How tests/e2e/test_differential_triton.py sends a RequestSpec (tests/e2e/differential.py): the shared
memory it needs (POSIX segments this test owns) and its three encodings: the exact bytes of an HTTP body,
tritonclient.http objects, a gRPC ModelInferRequest built with tritonclient's own protos.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

from differential import RequestSpec

_names = itertools.count()

# ---------------------------------------------------------------- client shared memory

class Segment:
    """A POSIX shared-memory segment this test owns (/dev/shm/<key>), mapped for reading and writing."""

    def __init__(self, size: int) -> None:
        self.key = f"/difftest_{os.getpid()}_{next(_names)}"
        self.size = max(size, 8)  # (a zero-length mapping is not allowed)
        fd = os.open("/dev/shm" + self.key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self.map = mmap.mmap(fd, self.size)
        except BaseException:
            os.unlink("/dev/shm" + self.key)
            raise
        finally:
            os.close(fd)

    def close(self) -> None:
        self.map.close()
        os.unlink("/dev/shm" + self.key)


@dataclass
class ShmPlan:
    """Where each shm tensor of a request lives: inputs in one segment both servers read; outputs in one
    segment per server (same layout), cleared before each request so a missing write shows."""

    region_in: str
    region_out: str
    inputs: dict[str, tuple[int, int]]  # name -> (offset, byte size)
    outputs: dict[str, tuple[int, int]]
    in_size: int
    out_size: int
    seg_in: Segment | None = None
    seg_out: dict[str, Segment] = field(default_factory=dict)  # server label -> its output segment

    @classmethod
    def layout(cls, spec: RequestSpec) -> ShmPlan:
        gap = spec.shm_gap
        n = next(_names)
        pos, ins = 0, {}
        for t in spec.inputs:
            if t.encoding == "shm":
                size = len(t.wire())
                ins[t.name] = (pos, size)
                pos += size + gap  # `gap` (drawn) leaves the next offset unaligned at times
        pos_out, outs = 0, {}
        for o in spec.outputs or ():
            if o.shm:
                size = spec.expected.get(o.name, 8)
                outs[o.name] = (pos_out, size)
                pos_out += size + gap
        return cls(f"d{n}_in", f"d{n}_out", ins, outs, pos, pos_out)

    def create(self, spec: RequestSpec, labels: list[str]) -> None:
        if self.inputs:
            self.seg_in = Segment(self.in_size)
            for t in spec.inputs:
                if t.name in self.inputs:
                    off, size = self.inputs[t.name]
                    self.seg_in.map[off:off + size] = t.wire()
        if self.outputs:
            for label in labels:
                self.seg_out[label] = Segment(self.out_size)

    def clear_outputs(self) -> None:
        for seg in self.seg_out.values():
            seg.map[:] = b"\xa5" * seg.size

    def read_outputs(self, label: str) -> dict[str, bytes]:
        seg = self.seg_out.get(label)
        return {name: bytes(seg.map[off:off + size]) for name, (off, size) in self.outputs.items()} if seg else {}

    def close(self) -> None:
        for seg in [self.seg_in, *self.seg_out.values()]:
            if seg is not None:
                seg.close()


# ---------------------------------------------------------------- encodings

def http_body(spec: RequestSpec, shm: ShmPlan | None) -> tuple[bytes, dict[str, str]]:
    """The exact HTTP request: a JSON document, then the binary inputs in order."""
    doc: dict[str, Any] = {}
    if spec.request_id is not None:
        doc["id"] = spec.request_id
    params = dict(spec.parameters)
    if spec.binary_data_output is not None:
        params["binary_data_output"] = spec.binary_data_output
    if params:
        doc["parameters"] = params
    inputs, blobs = [], []
    for t in spec.inputs:
        entry: dict[str, Any] = {"name": t.name, "shape": t.shape, "datatype": t.datatype}
        if t.encoding == "json":
            entry["data"] = t.json_data()
        elif t.encoding == "binary":
            blobs.append(t.wire())
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            assert shm is not None
            off, size = shm.inputs[t.name]
            entry["parameters"] = {"shared_memory_region": shm.region_in, "shared_memory_offset": off,
                                   "shared_memory_byte_size": size}
        inputs.append(entry)
    doc["inputs"] = inputs
    if spec.outputs is not None:
        outs = []
        for o in spec.outputs:
            entry = {"name": o.name}
            p: dict[str, Any] = {}
            if o.binary is not None:
                p["binary_data"] = o.binary
            if o.shm:
                assert shm is not None
                off, size = shm.outputs[o.name]
                p.update(shared_memory_region=shm.region_out, shared_memory_offset=off, shared_memory_byte_size=size)
            if p:
                entry["parameters"] = p
            outs.append(entry)
        doc["outputs"] = outs
    head = json.dumps(doc, ensure_ascii=spec.ascii_json, allow_nan=True).encode("utf-8")
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                     "Inference-Header-Content-Length": str(len(head))}


def client_inputs(module: Any, spec: RequestSpec, shm: ShmPlan | None) -> list[Any]:
    """tritonclient InferInput objects (`module` is tritonclient.http or tritonclient.grpc)."""
    out = []
    for t in spec.inputs:
        inp = module.InferInput(t.name, t.shape, t.datatype)
        if t.encoding == "shm":
            assert shm is not None
            off, size = shm.inputs[t.name]
            inp.set_shared_memory(shm.region_in, size, off)
        elif module.__name__.endswith("http"):
            inp.set_data_from_numpy(t.array, binary_data=t.encoding == "binary")
        else:
            inp.set_data_from_numpy(t.array)
        out.append(inp)
    return out


def client_outputs(module: Any, spec: RequestSpec, shm: ShmPlan | None) -> list[Any] | None:
    if spec.outputs is None:
        return None
    out = []
    http = module.__name__.endswith("http")
    for o in spec.outputs:
        req = module.InferRequestedOutput(o.name, binary_data=o.binary is not False) if http else \
            module.InferRequestedOutput(o.name)
        if o.shm:
            assert shm is not None
            off, size = shm.outputs[o.name]
            req.set_shared_memory(shm.region_out, size, off)
        out.append(req)
    return out


_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _param(msg: Any, value: Any) -> None:
    if isinstance(value, bool):
        msg.bool_param = value
    elif isinstance(value, int):
        msg.int64_param = value
    elif isinstance(value, float):
        msg.double_param = value
    else:
        msg.string_param = value


def grpc_request(pb: Any, spec: RequestSpec, shm: ShmPlan | None) -> Any:
    """A ModelInferRequest: "json" inputs as typed contents (where no input goes raw: the two cannot be
    mixed), "binary" ones as raw_input_contents, shm ones by region."""
    req = pb.ModelInferRequest(model_name=spec.model, id=spec.request_id or "")
    for k, v in spec.parameters.items():
        _param(req.parameters[k], v)
    raw = any(t.encoding == "binary" for t in spec.inputs)
    for t in spec.inputs:
        tensor = req.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if t.encoding == "shm":
            assert shm is not None
            off, size = shm.inputs[t.name]
            _param(tensor.parameters["shared_memory_region"], shm.region_in)
            _param(tensor.parameters["shared_memory_offset"], off)
            _param(tensor.parameters["shared_memory_byte_size"], size)
        elif raw or t.encoding == "binary":
            req.raw_input_contents.append(t.wire())
        else:
            values = list(t.array.reshape(-1))
            getattr(tensor.contents, _CONTENTS[t.datatype]).extend(
                [bytes(v) for v in values] if t.datatype == "BYTES" else [v.item() for v in values])
    for o in spec.outputs or ():
        out = req.outputs.add(name=o.name)
        if o.shm:
            assert shm is not None
            off, size = shm.outputs[o.name]
            _param(out.parameters["shared_memory_region"], shm.region_out)
            _param(out.parameters["shared_memory_offset"], off)
            _param(out.parameters["shared_memory_byte_size"], size)
    return req
