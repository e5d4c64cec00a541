"""A small, real DataPlane for testing the HTTP frontend alone: numpy models, in-process shm."""

from __future__ import annotations

import asyncio
import mmap
import os
from typing import Any

import numpy as np
from inferd.supervisor.core.dataplane import InProcessDataPlane
from inferd.supervisor.core.model_handle import GivenModel, ModelHandle
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg, not_found

ALL_DTYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
              "FP16", "FP32", "FP64", "BYTES", "BF16"]


def _model(name: str, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]],
           max_batch: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "name": name, "max_batch_size": max_batch,
        "input": [{"name": n, "data_type": BY_NAME[d].config_name, "dims": s} for n, d, s in inputs],
        "output": [{"name": n, "data_type": BY_NAME[d].config_name, "dims": s} for n, d, s in outputs],
        **extra,
    }


class FakeDataPlane(InProcessDataPlane):
    def __init__(self) -> None:
        self.is_ready = True
        self.models: dict[str, dict[str, Any]] = {
            "simple": _model("simple", [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])],
                             [("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])], max_batch=8),
            "decoupled": _model("decoupled", [("IN", "FP32", [1])], [("OUT", "FP32", [1])],
                                decoupled=True),
            "notready": _model("notready", [("IN", "FP32", [1])], [("OUT", "FP32", [1])], ready=False),
            "params": _model("params", [("IN", "INT32", [-1])], [("OUT", "INT32", [-1])]),
            "gate": _model("gate", [("IN", "INT32", [-1])], [("OUT", "INT32", [-1])]),
            "blob": _model("blob", [("IN", "BYTES", [1])], [("OUT", "BYTES", [1])]),
        }
        for dt in ALL_DTYPES:
            self.models["identity_" + dt] = _model("identity_" + dt, [("INPUT0", dt, [-1])],
                                                   [("OUTPUT0", dt, [-1])])
        self.gate: asyncio.Event | None = None
        self.gate_entered: asyncio.Event | None = None
        self.regions: dict[str, tuple[mmap.mmap, int, int, str]] = {}
        self.infer_count = 0
        self.last_request: InferRequest | None = None
        self.load_calls: list[tuple[str, dict[str, Any]]] = []
        self.unload_calls: list[tuple[str, bool]] = []
        self.log: dict[str, Any] = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                    "log_verbose_level": 0, "log_format": "default"}

    # ---- health and metadata ----
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.is_ready

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "triton", "version": "2.73.0dev", "extensions": ["binary_tensor_data", "statistics"]}

    def _get(self, name: str, version: str = "") -> dict[str, Any]:
        cfg = self.models.get(name)
        if cfg is None:
            raise invalid_arg(f"Request for unknown model: '{name}' is not found")
        if version not in ("", "1"):
            raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return cfg

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        cfg = self._get(name, version)
        batch = [-1] if cfg["max_batch_size"] > 0 else []

        def spec(t: dict[str, Any]) -> dict[str, Any]:
            dt = next(d for d in BY_NAME.values() if d.config_name == t["data_type"])
            return {"name": t["name"], "datatype": dt.name, "shape": batch + t["dims"]}

        return {"name": name, "versions": ["1"], "platform": "python",
                "inputs": [spec(t) for t in cfg["input"]], "outputs": [spec(t) for t in cfg["output"]]}

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._get(name, version).get("ready", True))

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return self._get(name, version)

    def model(self, name: str, version: str = "") -> ModelHandle:
        return GivenModel(name, version, self.model_is_decoupled(name, version),
                          lambda: self.model_metadata(name, version), lambda: self.model_config(name, version))

    def model_is_decoupled(self, name: str, version: str = "") -> bool:
        return bool(self._get(name, version).get("decoupled", False))

    # ---- inference ----
    async def infer(self, request: InferRequest) -> InferResponse:
        self.infer_count += 1
        self.last_request = request
        meta = self.model_metadata(request.model_name, request.model_version)
        name = request.model_name
        expected = {t["name"]: t for t in meta["inputs"]}
        if len(request.inputs) != len(expected):
            raise invalid_arg(f"expected {len(expected)} inputs but got {len(request.inputs)} inputs for "
                              f"model '{name}'")
        arrays: dict[str, Any] = {}
        for t in request.inputs:
            spec = expected.get(t.name)
            if spec is None:
                raise invalid_arg(f"unexpected inference input '{t.name}' for model '{name}'")
            if spec["datatype"] != t.datatype:
                raise invalid_arg(f"inference input '{t.name}' data-type is '{t.datatype}', but model "
                                  f"'{name}' expects '{spec['datatype']}'")
            arrays[t.name] = t
        out_names = [o["name"] for o in meta["outputs"]]
        for o in request.outputs:
            if o.name not in out_names:
                raise invalid_arg(f"unexpected inference output '{o.name}' for model '{name}'")
        if name == "gate" and self.gate is not None:
            assert self.gate_entered is not None
            self.gate_entered.set()
            await self.gate.wait()
        results: dict[str, Tensor] = {}
        if name == "simple":
            a = np.frombuffer(arrays["INPUT0"].data, "<i4")
            b = np.frombuffer(arrays["INPUT1"].data, "<i4")
            shape = arrays["INPUT0"].shape
            results["OUTPUT0"] = Tensor("OUTPUT0", "INT32", shape, (a + b).tobytes())
            results["OUTPUT1"] = Tensor("OUTPUT1", "INT32", shape, (a - b).tobytes())
        else:
            t = next(iter(arrays.values()))
            out = out_names[0]
            results[out] = Tensor(out, t.datatype, list(t.shape), bytes(t.data))
        wanted = [o.name for o in request.outputs] or out_names
        params: dict[str, Any] = {}
        if name == "params":
            params = dict(request.parameters)
            params.update(correlation_id=request.correlation_id, flags=request.flags,
                          priority=request.priority, timeout_us=request.timeout_us)
        return InferResponse(name, "1", request.id, [results[n] for n in wanted], params)

    # ---- statistics ----
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        names = [name] if name else sorted(self.models)
        for n in names:
            self._get(n, version)
        return {"model_stats": [{"name": n, "version": "1", "inference_count": 0} for n in names]}

    def metrics_text(self) -> bytes:
        return b'nv_inference_count{model="simple",version="1"} 0\n'

    # ---- repository ----
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [{"name": n, "version": "1", "state": "READY"} for n in sorted(self.models)]

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self.load_calls.append((name, parameters))
        if name == "missing":
            raise invalid_arg("failed to load 'missing', failed to poll from model repository")

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.unload_calls.append((name, unload_dependents))

    # ---- settings ----
    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        if update:
            self.log.update(update)
        return dict(self.log)

    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                "trace_file": "", "trace_mode": "triton"}

    # ---- shared memory (system only) ----
    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if name and name not in self.regions:
            raise not_found(f"Unable to find system shared memory region: '{name}'")
        return [{"name": n, "key": r[3], "offset": r[1], "byte_size": r[2]} for n, r in self.regions.items()
                if not name or n == name]

    def shm_register(self, kind: str, name: str, **fields: Any) -> None:
        if kind != "system":
            raise InferdError(ErrorCode.UNSUPPORTED, "CUDA shared memory is not supported")
        if name in self.regions:
            raise InferdError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        key = fields["key"].lstrip("/")
        fd = os.open("/dev/shm/" + key, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if fields["offset"] + fields["byte_size"] > size:
                raise invalid_arg("shared memory region is out of bounds")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.regions[name] = (mm, fields["offset"], fields["byte_size"], fields["key"])

    def shm_unregister(self, kind: str, name: str = "") -> None:
        for n in [name] if name else list(self.regions):
            region = self.regions.pop(n, None)
            if region is not None:
                region[0].close()

    def _region(self, region: str, offset: int, size: int) -> tuple[mmap.mmap, int]:
        r = self.regions.get(region)
        if r is None:
            raise invalid_arg(f"Unable to find shared memory region: '{region}'")
        if offset + size > r[2]:
            raise invalid_arg(f"shared memory region '{region}' is too small")
        return r[0], r[1] + offset

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> memoryview:
        mm, start = self._region(region, offset, byte_size)
        return memoryview(mm[start:start + byte_size])

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        data = memoryview(data).cast("B")
        mm, start = self._region(region, offset, len(data))
        mm[start:start + len(data)] = data
