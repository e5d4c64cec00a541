"""An output requested twice over gRPC: Triton 2.51 answers it once, as first requested (inferd answered
INVALID_ARGUMENT); found by tests/e2e/test_differential_triton.py."""

from __future__ import annotations

import pytest
from inferd.supervisor.grpc_api import convert
from inferd.worker.wire.errors import InferdError


class Regions:
    """Just enough of a DataPlane for shared-memory outputs: every region is host memory."""

    def shm_is_cuda(self, region: str) -> bool:
        return False

    def shm_check(self, region: str, offset: int, byte_size: int) -> None:
        return None

    def shm_hold(self, names: object) -> None:
        return None


def to_core(outputs: list[convert.ParsedOutput]) -> tuple:
    return convert.to_core(convert.ParsedRequest("m", outputs=outputs), Regions())  # type: ignore[arg-type]


def shm(region: str, size: int) -> dict:
    return {"shared_memory_region": ("string_param", region), "shared_memory_byte_size": ("int64_param", size)}


def test_a_repeated_output_is_kept_once_with_its_first_parameters():
    req, shm_out = to_core([convert.ParsedOutput("A", {"classification": ("int64_param", 2)}),
                            convert.ParsedOutput("B", {}), convert.ParsedOutput("A", {})])
    assert [(o.name, o.parameters) for o in req.outputs] == [("A", {"classification": 2}), ("B", {})]
    assert shm_out is None


def test_the_first_shared_memory_region_of_a_repeated_output_wins():
    req, shm_out = to_core([convert.ParsedOutput("A", shm("r1", 8)), convert.ParsedOutput("A", shm("r2", 16))])
    assert [o.name for o in req.outputs] == ["A"]
    assert shm_out == {"A": ("r1", 0, 8)}
    req, shm_out = to_core([convert.ParsedOutput("A", {}), convert.ParsedOutput("A", shm("r2", 16))])
    assert [o.name for o in req.outputs] == ["A"] and shm_out is None


def test_a_repeated_output_still_has_its_parameters_checked():
    with pytest.raises(InferdError, match="classification"):
        to_core([convert.ParsedOutput("A", {}), convert.ParsedOutput("A", {"classification": ("int64_param", -1)})])
