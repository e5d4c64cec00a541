"""Helpers for repository tests: build model directories under tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from inferd.supervisor.repository import layout

MakeModel = Callable[..., Path]


def write_model(
    root: Path,
    name: str,
    config: str | None = None,
    versions: Iterable[int | str] = (1,),
    files: Iterable[str] = ("model.py",),
) -> Path:
    model = root / name
    model.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model / "config.pbtxt").write_text(config)
    for v in versions:
        vdir = model / str(v)
        vdir.mkdir(exist_ok=True)
        for f in files:
            (vdir / f).write_text("# model file\n")
    return model


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def make_model(repo: Path) -> MakeModel:
    def make(name: str, config: str | None = None, **kw: object) -> Path:
        return write_model(repo, name, config, **kw)  # type: ignore[arg-type]

    return make


@pytest.fixture
def source_of(repo: Path) -> Callable[[str], layout.ModelSource]:
    def read(name: str) -> layout.ModelSource:
        return layout.read_model(str(repo), name)

    return read
