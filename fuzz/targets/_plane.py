"""A small in-memory DataPlane for the codec targets: shared-memory regions as bytes, and the metadata of a
few models (the raw binary form, `Inference-Header-Content-Length: 0`, reads its input from it). The codec
asks nothing else of its data plane while parsing; inference itself is not fuzzed here."""

from __future__ import annotations

from typing import Any

from inferd.supervisor.core.dataplane import InProcessDataPlane
from inferd.supervisor.core.model_handle import GivenModel, ModelHandle
from inferd.supervisor.inference.types import InferRequest, InferResponse
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg

# region name -> its bytes (a pattern, so that a misplaced offset reads different bytes)
REGIONS = {"r0": bytes(range(256)) * 16, "small": b"\x01\x02\x03\x04\x05\x06\x07\x08"}

# model -> (input name, datatype, dims, max_batch_size): single-input models for the raw binary form
MODELS = {
    "m": ("INPUT0", "FP32", [-1], 0),
    "fixed": ("INPUT0", "INT16", [2, 3], 0),
    "batched": ("X", "UINT8", [2, -1], 8),
    "text": ("TEXT", "BYTES", [1], 0),
    "two_var": ("Y", "FP64", [-1, -1], 0),
}


class MemoryPlane(InProcessDataPlane):
    def _model(self, name: str) -> tuple[str, str, list[int], int]:
        m = MODELS.get(name)
        if m is None:
            raise invalid_arg(f"Request for unknown model: '{name}' is not found")
        return m

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "inferd", "version": "fuzz", "extensions": []}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        inp, dt, dims, batch = self._model(name)
        shape = ([-1] if batch else []) + dims
        return {"name": name, "versions": ["1"], "platform": "python",
                "inputs": [{"name": inp, "datatype": dt, "shape": shape}], "outputs": []}

    def model_ready(self, name: str, version: str = "") -> bool:
        return True

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return {"name": name, "max_batch_size": self._model(name)[3]}

    def model(self, name: str, version: str = "") -> ModelHandle:
        return GivenModel(name, version, self.model_is_decoupled(name, version),
                          lambda: self.model_metadata(name, version), lambda: self.model_config(name, version))

    def model_is_decoupled(self, name: str, version: str = "") -> bool:
        return False

    async def infer(self, request: InferRequest) -> InferResponse:
        raise InferdError(ErrorCode.UNSUPPORTED, "the fuzz data plane does not run models")

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return {"model_stats": []}

    def metrics_text(self) -> bytes:
        return b""

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return []

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        raise InferdError(ErrorCode.UNSUPPORTED, "no repository")

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        raise InferdError(ErrorCode.UNSUPPORTED, "no repository")

    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        return {}

    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        return {}

    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        return []

    def shm_register(self, kind: str, name: str, **fields: Any) -> None:
        raise InferdError(ErrorCode.UNSUPPORTED, "regions are fixed here")

    def shm_unregister(self, kind: str, name: str = "") -> None:
        pass

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> Any:
        data = REGIONS.get(region)
        if data is None:
            raise invalid_arg(f"Unable to find shared memory region: '{region}'")
        if offset + byte_size > len(data):
            raise invalid_arg(f"shared memory region '{region}' is too small")
        return memoryview(data)[offset:offset + byte_size]

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        raise InferdError(ErrorCode.UNSUPPORTED, "outputs are not written here")
