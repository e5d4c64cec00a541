"""layout.py: model name validation, repository scan, versions, config files, fingerprints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from inferd.supervisor.repository import layout
from inferd.worker.wire.errors import ErrorCode, InferdError

from .conftest import write_model

# reliability.md §3.3 A1
BAD_NAMES = [
    "..", ".", "../x", "a/../b", "/etc/passwd", "model/", " ..", ".. ", "%2e%2e%2f", "..%2f", "a\x00b",
    "a\\b", "..\\x", "x" * 256, "   ", "", "\t", "a b", "m\n", "módel", "a:b", "~root", "a/b",
]
GOOD_NAMES = ["..my_model", "model..1", "add_sub", "simple-model", "Model.v2", "_x", "0", "...", ".hidden", "a" * 255]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_invalid_arg(name: str) -> None:
    with pytest.raises(InferdError) as e:
        layout.validate_model_name(name)
    assert e.value.code == ErrorCode.INVALID_ARG
    assert "invalid model name" in e.value.message


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_pass(name: str) -> None:
    assert layout.validate_model_name(name) == name


def test_non_string_name_is_invalid() -> None:
    with pytest.raises(InferdError):
        layout.validate_model_name(b"abc")


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../b", "..", "a\x00b"])
def test_bad_name_touches_no_filesystem(name: str, repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("filesystem touched")

    for fn in ("stat", "listdir", "walk", "scandir"):
        monkeypatch.setattr(layout.os, fn, boom)
    with pytest.raises(InferdError) as e:
        layout.find_model([str(repo)], name)
    assert e.value.code == ErrorCode.INVALID_ARG
    with pytest.raises(InferdError):
        layout.read_model(str(repo), name)


def test_positive_dotted_name_reaches_not_found(repo: Path) -> None:
    with pytest.raises(InferdError) as e:
        layout.find_model([str(repo)], "..my_model")
    assert e.value.code == ErrorCode.NOT_FOUND


def test_list_models_dirs_only_hidden_included_invalid_reported(repo: Path) -> None:
    write_model(repo, "a")
    write_model(repo, ".hidden")
    (repo / "README.md").write_text("not a model")
    (repo / "bad name").mkdir()
    (repo / "bad name" / "config.pbtxt").write_text("")
    scan = layout.list_models([str(repo)])
    assert sorted(scan.models) == [".hidden", "a"]
    assert "bad name" in scan.invalid
    assert scan.all_names() == [".hidden", "a", "bad name"]
    err = scan.error_for("bad name")
    assert err is not None and err.code == ErrorCode.INVALID_ARG


def test_directory_that_can_never_be_a_model_is_left_out(repo: Path) -> None:
    """examples/python_api (scripts, no config.pbtxt, no version directory) must not fail `make run`."""
    write_model(repo, "a")
    scripts = repo / "python_api"
    scripts.mkdir()
    (scripts / "add_sub.py").write_text("print('not a model')")
    (repo / "auto_completed").mkdir()
    (repo / "auto_completed" / "1").mkdir()  # no config, but a version directory: still a model
    scan = layout.list_models([str(repo)])
    assert sorted(scan.models) == ["a", "auto_completed"]
    assert scan.all_names() == ["a", "auto_completed"]


def test_duplicates_across_repositories(tmp_path: Path) -> None:
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    write_model(r1, "dup")
    write_model(r2, "dup")
    write_model(r1, "only1")
    write_model(r2, "only2")
    scan = layout.list_models([str(r1), str(r2)])
    assert scan.models == {"only1": str(r1), "only2": str(r2)}
    assert scan.duplicates == {"dup": (str(r1), str(r2))}
    err = scan.error_for("dup")
    assert err is not None and "more than one model repository" in err.message
    assert scan.error_for("only1") is None
    with pytest.raises(InferdError) as e:
        layout.find_model([str(r1), str(r2)], "dup")
    assert e.value.code == ErrorCode.INVALID_ARG
    assert layout.find_model([str(r1), str(r2)], "only2").repo == str(r2)


def test_missing_repository_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InferdError, match="failed to read model repository"):
        layout.list_models([str(tmp_path / "nope")])


def test_versions_numeric_dirs_only(repo: Path) -> None:
    names = ["1", "2", "10", "0", "010", "abc", "00", "-1", "1a", "99999999999999999999"]
    model = write_model(repo, "m", versions=names)
    (model / "3").write_text("a file, not a directory")
    assert layout.find_versions(str(model)) == (0, 1, 2, 10)


def test_read_model_with_and_without_config(repo: Path) -> None:
    write_model(repo, "with", 'backend: "python"\n', versions=[2, 1])
    write_model(repo, "without")
    s = layout.read_model(str(repo), "with")
    assert s.name == "with" and s.repo == str(repo) and s.path == str(repo / "with")
    assert s.versions == (1, 2)
    assert s.config_text == 'backend: "python"\n'
    assert s.config_path == str(repo / "with" / "config.pbtxt")
    assert s.version_path(2) == str(repo / "with" / "2")
    s2 = layout.read_model(str(repo), "without")
    assert s2.config_text is None and s2.config_path is None
    with pytest.raises(InferdError) as e:
        layout.read_model(str(repo), "absent")
    assert e.value.code == ErrorCode.NOT_FOUND


def test_model_config_name(repo: Path) -> None:
    model = write_model(repo, "m", 'backend: "python"\n')
    (model / "configs").mkdir()
    (model / "configs" / "h100.pbtxt").write_text('backend: "python"\nmax_batch_size: 64\n')
    s = layout.read_model(str(repo), "m", model_config_name="h100")
    assert s.config_path == str(model / "configs" / "h100.pbtxt")
    assert "max_batch_size: 64" in (s.config_text or "")
    # falls back to config.pbtxt when the named one is absent
    s2 = layout.read_model(str(repo), "m", model_config_name="a100")
    assert s2.config_path == str(model / "config.pbtxt")
    with pytest.raises(InferdError, match="invalid model config name"):
        layout.read_model(str(repo), "m", model_config_name="../../etc/passwd")


def test_config_that_is_a_directory_or_too_big(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_model(repo, "m")
    (model / "config.pbtxt").mkdir()
    with pytest.raises(InferdError, match="not a regular file"):
        layout.read_model(str(repo), "m")
    (model / "config.pbtxt").rmdir()
    (model / "config.pbtxt").write_text("x" * 100)
    monkeypatch.setattr(layout, "MAX_CONFIG_BYTES", 10)
    with pytest.raises(InferdError, match="more than the 10 allowed"):
        layout.read_model(str(repo), "m")


def test_config_not_utf8(repo: Path) -> None:
    model = write_model(repo, "m")
    (model / "config.pbtxt").write_bytes(b'name: "\xff"')
    with pytest.raises(InferdError, match="not valid UTF-8"):
        layout.read_model(str(repo), "m")


def test_fingerprint_changes_on_any_change(repo: Path) -> None:
    model = write_model(repo, "m", 'backend: "python"\n')
    f0 = layout.read_model(str(repo), "m").fingerprint
    assert f0 == layout.read_model(str(repo), "m").fingerprint
    (model / "labels.txt").write_text("a\nb\n")
    f1 = layout.read_model(str(repo), "m").fingerprint
    assert f1 != f0
    (model / "2").mkdir()
    f2 = layout.read_model(str(repo), "m").fingerprint
    assert f2 != f1
    st = os.stat(model / "config.pbtxt")
    os.utime(model / "config.pbtxt", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert layout.read_model(str(repo), "m").fingerprint != f2
    assert layout.read_model(str(repo), "m", with_fingerprint=False).fingerprint == ""


def test_scan_repositories_reads_each_model(repo: Path) -> None:
    write_model(repo, "ok", 'backend: "python"\n')
    model = write_model(repo, "broken")
    (model / "config.pbtxt").mkdir()
    scan, sources = layout.scan_repositories([str(repo)])
    assert sorted(scan.models) == ["broken", "ok"]
    assert isinstance(sources["ok"], layout.ModelSource)
    assert isinstance(sources["broken"], InferdError)


def test_symlinked_model_directory_is_followed(repo: Path, tmp_path: Path) -> None:
    real = write_model(tmp_path / "elsewhere", "real", 'backend: "python"\n')
    os.symlink(real, repo / "linked")
    s = layout.find_model([str(repo)], "linked")
    assert s.versions == (1,) and s.config_text
