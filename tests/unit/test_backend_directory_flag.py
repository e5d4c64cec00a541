"""--backend-directory (issue 43 item 9): read, not ignored; Triton's default; the path the loader gets."""

from __future__ import annotations

from inferd.supervisor.core.load_settings import LoaderSettings
from inferd.supervisor.flags import parse_args


def parse(tmp_path, *flags: str):
    return parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"), *flags], environ={})


def test_default_is_tritons_layout(tmp_path):
    assert parse(tmp_path).backend_directory == "/opt/tritonserver/backends"


def test_the_directory_reaches_the_loader_and_is_not_called_inert(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = parse(tmp_path, "--backend-directory=backends")
    assert config.backend_directory == str(tmp_path / "backends")  # absolute: workers run elsewhere
    assert not [note for note in config.inert_flags if "--backend-directory" in note]
    settings = LoaderSettings.from_config(config, runtime=None)  # type: ignore[arg-type]
    assert settings.backend_directory == str(tmp_path / "backends")
