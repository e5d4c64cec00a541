"""Runs the gRPC frontend over a small in-test DataPlane, for tests that drive it with tritonclient.

Usage: python _server_main.py  (binds 127.0.0.1 on a free port; the log line
"Started GRPCInferenceService at 127.0.0.1:<port>" on stdout tells the test where). Exits when stdin
closes, so a dying test run never leaves it behind.

Models (numpy, in process; enough to exercise the frontend alone):
- identity: every input INPUTi comes back as OUTPUTi, any datatype and shape.
- add_sub: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (same numeric datatype).
- repeat (decoupled): one response per element of INT32 input IN; with request parameter
  mark_final=true the responses carry the core's final mark and end with a flag-only final.
- slow: waits until cancelled; started and cancelled requests are counted.
- started / cancelled: return that count once it reaches the INT32 input WANT (waits up to 5 s).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from inferd.supervisor.config import GrpcKeepalive
from inferd.supervisor.core.dataplane import InProcessDataPlane
from inferd.supervisor.core.model_handle import GivenModel, ModelHandle
from inferd.supervisor.grpc_api.grpcio_server import start_grpc_server
from inferd.supervisor.grpc_api.http2 import abuse, connection, sending
from inferd.supervisor.grpc_api.native_server import start_native_server
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg

MODELS = ("identity", "add_sub", "repeat", "slow", "started", "cancelled")


def _array(t: Tensor) -> np.ndarray:
    dt = BY_NAME[t.datatype]
    if dt.numpy is None or dt.itemsize == 0:
        raise invalid_arg("unsupported datatype for add_sub")
    return np.frombuffer(t.data, dtype=dt.numpy).reshape(t.shape)


def _config(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": name,
        "platform": "",
        "backend": "python",
        "max_batch_size": 8,
        "version_policy": {"latest": {"num_versions": 1}},
        "input": [
            {
                "name": "INPUT0",
                "data_type": "TYPE_FP32",
                "dims": [4],
                "format": "FORMAT_NONE",
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": False,
            },
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4], "label_filename": ""}],
        "instance_group": [{"name": name, "kind": "KIND_CPU", "count": 1, "gpus": [], "profile": []}],
        "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 100},
        "parameters": {"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}},
        "model_transaction_policy": {"decoupled": name == "repeat"},
        "an_unknown_field": 1,
    }
    return cfg


class TestDataPlane(InProcessDataPlane):
    def __init__(self) -> None:
        self.counts = {"started": 0, "cancelled": 0}
        self.changed = asyncio.Condition()
        self.regions: dict[str, tuple[str, int, int]] = {}
        self.log: dict[str, Any] = {"log_info": True, "log_verbose_level": 0, "log_format": "default"}

    def _check(self, name: str) -> None:
        if name not in MODELS:
            raise invalid_arg(f"Request for unknown model: '{name}' is not found")

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "triton", "version": "2.51.0", "extensions": ["classification", "sequence"]}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name)
        return {
            "name": name,
            "versions": ["1"],
            "platform": "python",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        }

    def model_ready(self, name: str, version: str = "") -> bool:
        self._check(name)
        return True

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name)
        return _config(name)

    def model(self, name: str, version: str = "") -> ModelHandle:
        return GivenModel(name, version, self.model_is_decoupled(name, version),
                          lambda: self.model_metadata(name, version), lambda: self.model_config(name, version))

    def model_is_decoupled(self, name: str, version: str = "") -> bool:
        self._check(name)
        return name == "repeat"

    async def infer(self, request: InferRequest) -> InferResponse:
        self._check(request.model_name)
        resp = InferResponse(request.model_name, "1", request.id)
        name = request.model_name
        if name == "identity":
            for i, t in enumerate(request.inputs):
                out = Tensor(t.name.replace("INPUT", "OUTPUT"), t.datatype, t.shape, t.data)
                if i == 0 and request.parameters:
                    out.parameters = {"echo_" + k: v for k, v in request.parameters.items()}
                resp.outputs.append(out)
            resp.parameters = {
                "sequence_id": request.correlation_id,
                "flags": request.flags,
                "priority": request.priority,
                "timeout": request.timeout_us,
            }
        elif name == "add_sub":
            a, b = (_array(t) for t in request.inputs[:2])
            dt = request.inputs[0].datatype
            resp.outputs.append(Tensor("OUTPUT0", dt, list(a.shape), (a + b).tobytes()))
            resp.outputs.append(Tensor("OUTPUT1", dt, list(a.shape), (a - b).tobytes()))
        elif name == "slow":
            async with self.changed:
                self.counts["started"] += 1
                self.changed.notify_all()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.counts["cancelled"] += 1
                async with self.changed:
                    self.changed.notify_all()
                raise
        elif name in ("started", "cancelled"):
            want = int(_array(request.inputs[0]).reshape(-1)[0])
            async with asyncio.timeout(5), self.changed:
                await self.changed.wait_for(lambda: self.counts[name] >= want)
            resp.outputs.append(Tensor("COUNT", "INT32", [1], np.int32(self.counts[name]).tobytes()))
        else:
            raise InferdError(ErrorCode.UNSUPPORTED, "decoupled")
        return resp

    async def stream_infer(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if request.model_name != "repeat":
            yield await self.infer(request)
            return
        values = _array(request.inputs[0]).reshape(-1)
        mark = bool(request.parameters.get("mark_final"))
        for v in values:
            if v < 0:
                raise invalid_arg("repeat: negative value")
            r = InferResponse("repeat", "1", request.id, [Tensor("OUT", "INT32", [1], np.int32(v).tobytes())])
            if mark:
                r.parameters = {"triton_final_response": False}
            yield r
        if mark:
            yield InferResponse("repeat", "1", request.id, [], {"triton_final_response": True})

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if name:
            self._check(name)
        names = [name] if name else list(MODELS)
        return {
            "model_stats": [
                {
                    "name": n,
                    "version": "1",
                    "last_inference": 1700000000000,
                    "inference_count": 3,
                    "execution_count": 2,
                    "inference_stats": {"success": {"count": 3, "ns": 1000}, "fail": {"count": 0, "ns": 0}},
                    "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 2, "ns": 500}}],
                    "response_stats": {"0": {"success": {"count": 1, "ns": 5}}},
                }
                for n in names
            ]
        }

    def metrics_text(self) -> bytes:
        return b""

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [{"name": n, "version": "1", "state": "READY", "reason": ""} for n in MODELS]

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        if name != "identity":
            raise invalid_arg(f"load: {sorted(parameters)}")

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check(name)

    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        self.log.update(update or {})
        return dict(self.log)

    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"trace_level": ["OFF"], "trace_rate": "1000", **(update or {})}

    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if kind == "cuda":
            return []
        return [
            {"name": n, "key": k, "offset": o, "byte_size": s}
            for n, (k, o, s) in self.regions.items()
            if not name or n == name
        ]

    def shm_register(self, kind: str, name: str, **fields: Any) -> None:
        if kind != "system":
            raise InferdError(ErrorCode.UNSUPPORTED, "no CUDA here")
        self.regions[name] = (fields["key"], fields["offset"], fields["byte_size"])

    def shm_unregister(self, kind: str, name: str = "") -> None:
        if name:
            self.regions.pop(name, None)
        else:
            self.regions.clear()

    def _map(self, region: str, offset: int, size: int) -> mmap.mmap:
        if region not in self.regions:
            raise invalid_arg(f"Unable to find shared memory region: '{region}'")
        key, base, total = self.regions[region]
        if offset + size > total:
            raise invalid_arg("shared memory access out of bounds")
        fd = os.open("/dev/shm/" + key.lstrip("/"), os.O_RDWR)
        try:
            return mmap.mmap(fd, base + total)
        finally:
            os.close(fd)

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> memoryview:
        m = self._map(region, offset, byte_size)
        start = self.regions[region][1] + offset
        try:
            return memoryview(m[start : start + byte_size])
        finally:
            m.close()

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        view = memoryview(data).cast("B")
        m = self._map(region, offset, view.nbytes)
        start = self.regions[region][1] + offset
        m[start : start + view.nbytes] = view
        m.close()


async def main() -> None:
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    kind = sys.argv[1] if len(sys.argv) > 1 else "native"
    if kind == "grpcio":
        server: Any = await start_grpc_server(TestDataPlane(), "127.0.0.1", 0)
    elif kind == "native-lax":  # the flood suite's backstops, with the limits in front of them lifted
        abuse.GLITCH_BURST = 10**9
        connection.HANDSHAKE_TIMEOUT_S = 1.0
        sending.MAX_PENDING_OUT = 1 << 20
        server = await start_native_server(TestDataPlane(), "127.0.0.1", 0, keepalive=GrpcKeepalive(max_ping_strikes=0))
    else:
        server = await start_native_server(TestDataPlane(), "127.0.0.1", 0)
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # returns when the test closes our stdin
    await server.stop(1.0)


if __name__ == "__main__":
    asyncio.run(main())
