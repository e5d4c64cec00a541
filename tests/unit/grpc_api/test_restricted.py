"""--grpc-restricted-protocol and --grpc-header-forward-pattern in the service (servicer.Policy) and in
the native server's method table; the servers themselves are driven in tests/e2e/test_restricted_api.py.

In process, without tritonclient (our generated messages only, DESIGN.md Known traps).
"""

from __future__ import annotations

import asyncio
from typing import Any

from inferd.supervisor.config import RESTRICTABLE
from inferd.supervisor.core.model_handle import GivenModel
from inferd.supervisor.grpc_api import convert
from inferd.supervisor.grpc_api.http2.grpc_calls import Context
from inferd.supervisor.grpc_api.native_server import build_methods
from inferd.supervisor.grpc_api.servicer import CATEGORIES, HEALTH_SERVICE, SERVICE, InferenceService, Policy
from inferd.supervisor.inference.types import InferResponse

# Triton 2.51's category of each RPC, observed with every category restricted to its own key
TRITON = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "Check": "health",  # grpc.health.v1.Health
}
EVERY = {cat: (f"k-{cat}", "v") for cat in RESTRICTABLE}


class _DataPlane:
    """What ModelInfer's start path asks of the data plane."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def model(self, name: str, version: str = "") -> Any:
        return GivenModel(name, version, False, dict, dict)

    def infer_nowait(self, request: Any) -> Any:
        self.requests.append(request)
        return None


def test_categories_as_triton() -> None:
    assert CATEGORIES == TRITON
    assert set(CATEGORIES.values()) == set(RESTRICTABLE)


def test_every_served_method_has_its_rule() -> None:
    methods = build_methods(InferenceService(_DataPlane(), Policy(EVERY)))  # type: ignore[arg-type]
    assert len(methods) == len(TRITON)
    for path, method in methods.items():
        service, name = path[1:].split("/")
        assert service in (SERVICE, HEALTH_SERVICE)
        assert method.rule is not None
        assert method.rule.header == f"triton-grpc-protocol-k-{TRITON[name]}"
        assert method.rule.message == f"This protocol is restricted, expecting header '{method.rule.header}'"


def test_nothing_restricted_by_default() -> None:
    service = InferenceService(_DataPlane())  # type: ignore[arg-type]
    assert service.forward is None and service.stream.forward is None
    assert all(method.rule is None for method in build_methods(service).values())


def test_service_applies_its_policy() -> None:
    service = InferenceService(_DataPlane(), Policy({"inference": ("a", "b")}, "x-.*"))  # type: ignore[arg-type]
    assert service.policy.rule("ModelInfer") is not None and service.policy.rule("ServerLive") is None
    assert service.forward is not None and service.stream.forward is service.forward


def test_policy_of_config() -> None:
    config = type("C", (), {"grpc_restricted": {"health": ("k", "v")}, "grpc_header_forward_pattern": "^x"})()
    policy = Policy.of(config)
    rule = policy.rule("Check")
    assert rule is not None and rule.header == "triton-grpc-protocol-k"
    assert policy.forward is not None and policy.forward.search("X-a")


def test_model_infer_forwards_metadata_after_the_request_parameters() -> None:
    dp = _DataPlane()
    service = InferenceService(dp, Policy(forward_pattern="x-fw.*"))  # type: ignore[arg-type]
    request = convert.ParsedRequest("m", parameters={"x-fw-n": ("int64_param", 7), "own": ("string_param", "o")})
    context = Context([("user-agent", "ua"), ("x-fw-n", "9"), ("x-fw-a", "1"), ("other", "2")])
    service.infer_start(request, context)
    assert dp.requests[0].parameters == {"x-fw-n": "9", "own": "o", "x-fw-a": "1"}
    service.infer_start(convert.ParsedRequest("m"))  # no context: nothing to forward
    assert dp.requests[1].parameters == {}


def test_stream_forwards_the_stream_metadata() -> None:
    dp = _DataPlane()
    service = InferenceService(dp, Policy(forward_pattern="x-fw.*"))  # type: ignore[arg-type]
    seen: list[Any] = []

    async def infer(request: Any) -> InferResponse:
        seen.append(request)
        return InferResponse("m", "1")

    async def requests() -> Any:
        yield convert.ParsedRequest("m", parameters={"own": ("bool_param", True)})

    async def run() -> list[Any]:
        dp.infer = infer  # type: ignore[attr-defined]
        context = Context([("x-fw-s", "st"), ("te", "trailers")])
        return [message async for message in service.stream.handle(requests(), context)]

    assert len(asyncio.run(run())) == 1
    assert [r.parameters for r in seen] == [{"own": True, "x-fw-s": "st"}]
