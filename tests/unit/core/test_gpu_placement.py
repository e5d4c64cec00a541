"""GPU placement at the loader level: the GPUs discovery found (LoaderSettings.gpu_ids) decide KIND_AUTO,
fill KIND_GPU groups without `gpus`, start `count` instances on each listed GPU (kind and device id in
each LoadModel), and a listed GPU that does not exist refuses the load naming it (the model then stays
UNAVAILABLE with that reason: tests/e2e/test_gpu_placement.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.core import loader
from inferd.supervisor.core.load_settings import LoaderSettings
from inferd.supervisor.core.runtime import Runtime
from inferd.worker.wire.errors import ErrorCode, InferdError

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _settings(repo: Path, gpu_ids: tuple[int, ...]) -> LoaderSettings:
    runtime = Runtime(str(repo), False, channel=None, launcher=None, pool=None,  # type: ignore[arg-type]
                             client_shm=None)  # type: ignore[arg-type]
    return LoaderSettings((str(repo),), False, 16, 1.0, WorkerTimings(), 0, runtime, gpu_ids=gpu_ids)


def _model(repo: Path, name: str, groups: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (repo / name / "config.pbtxt").write_text(f'backend: "python"\n{IO}{groups}')


def _placed(repo: Path, name: str, gpu_ids: tuple[int, ...]) -> list[tuple[str, str, int]]:
    settings = _settings(repo, gpu_ids)

    async def place() -> list[tuple[str, str, int]]:  # instances belong to a running loop
        plan = await loader.plan_load(settings, name, None, None)
        return [(i.load.instance_name, i.load.instance_kind, i.load.device_id)
                for i in loader.make_instances(settings, plan, 1)]

    return asyncio.run(place())


def _refusal(repo: Path, name: str, gpu_ids: tuple[int, ...]) -> str:
    with pytest.raises(InferdError) as exc:
        _placed(repo, name, gpu_ids)
    assert exc.value.code == ErrorCode.INVALID_ARG
    return exc.value.message


def test_kind_gpu_count_on_each_listed_gpu(tmp_path: Path) -> None:
    _model(tmp_path, "m", "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 1, 2 ] } ]")
    assert _placed(tmp_path, "m", (0, 1, 2)) == [
        ("m_0_0", "GPU", 1), ("m_0_1", "GPU", 1), ("m_0_2", "GPU", 2), ("m_0_3", "GPU", 2)]


def test_kind_gpu_without_gpus_uses_every_gpu(tmp_path: Path) -> None:
    _model(tmp_path, "m", "instance_group [ { kind: KIND_GPU count: 1 } ]")
    assert _placed(tmp_path, "m", (0, 1)) == [("m_0_0", "GPU", 0), ("m_0_1", "GPU", 1)]


def test_groups_number_their_instances_separately(tmp_path: Path) -> None:
    _model(tmp_path, "m", "instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_GPU gpus: [ 0, 1 ] } ]")
    assert _placed(tmp_path, "m", (0, 1)) == [
        ("m_0_0", "CPU", 0), ("m_0_1", "CPU", 0), ("m_1_0", "GPU", 0), ("m_1_1", "GPU", 1)]


def test_kind_auto_follows_the_discovered_gpus(tmp_path: Path) -> None:
    _model(tmp_path, "auto", "")  # no instance_group: one implicit KIND_AUTO group
    assert _placed(tmp_path, "auto", ()) == [("auto_0", "CPU", 0)]
    assert _placed(tmp_path, "auto", (0, 1)) == [("auto_0", "GPU", 0), ("auto_1", "GPU", 1)]
    _model(tmp_path, "auto1", "instance_group [ { kind: KIND_AUTO gpus: [ 1 ] } ]")
    assert _placed(tmp_path, "auto1", (0, 1)) == [("auto1_0_0", "GPU", 1)]
    # as Triton: a KIND_AUTO group listing a GPU that is absent becomes KIND_CPU, which may not list GPUs
    msg = _refusal(tmp_path, "auto1", (0,))
    assert "KIND_CPU but specifies one or more GPUs" in msg


def test_missing_gpu_is_named(tmp_path: Path) -> None:
    _model(tmp_path, "m", "instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]")
    msg = _refusal(tmp_path, "m", (0, 1))
    assert "invalid or unsupported gpu id 3" in msg and "GPUs available: 0 1" in msg
    msg = _refusal(tmp_path, "m", ())
    assert msg == "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"
