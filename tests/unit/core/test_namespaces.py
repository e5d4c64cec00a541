"""Model namespacing's name resolution and flags (core/namespaces.py, issue 43 item 10); the served behaviour
is tests/e2e/test_model_namespacing.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from inferd.supervisor.core import namespaces
from inferd.supervisor.flags import parse_args
from inferd.supervisor.repository.layout import RepositoryScan
from inferd.worker.wire.errors import ErrorCode, InferdError


@dataclass
class Entry:
    versions: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)


LOADED = {1: object()}
A, B = "/repos/a", "/repos/b"


def test_keys_split_back():
    key = namespaces.key(A, "m")
    assert key == "/repos/a::m" and namespaces.split(key) == (A, "m") and namespaces.split("m") == ("", "m")
    scan = RepositoryScan(models={"solo": B}, duplicates={"m": (A, B)})
    assert namespaces.keys_in(scan, "m") == [f"{A}::m", f"{B}::m"] and namespaces.keys_in(scan, "none") == []
    assert namespaces.all_keys(scan) == [f"{A}::m", f"{B}::m", f"{B}::solo"]


def test_a_plain_name_of_several_models_is_refused_with_tritons_words():
    entries = {f"{A}::m": Entry(LOADED), f"{B}::m": Entry(LOADED), f"{B}::solo": Entry(LOADED)}
    assert namespaces.pick(entries, "solo") is entries[f"{B}::solo"]
    with pytest.raises(InferdError) as info:
        namespaces.pick(entries, "m")
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == ("There are 2 identifiers of model 'm' in global map, model namespace must be "
                                  "provided to resolve ambiguity.")
    assert namespaces.pick(entries, "other") is None


def test_a_model_removed_from_its_repository_no_longer_makes_its_name_ambiguous():
    entries = {f"{A}::m": Entry(records={1: ("UNAVAILABLE", "unloaded")}), f"{B}::m": Entry(LOADED)}
    assert namespaces.pick(entries, "m") is entries[f"{B}::m"]


def test_a_step_prefers_its_own_repository_then_the_one_loaded_elsewhere():
    own, other = Entry(LOADED), Entry(LOADED)
    entries = {f"{A}::m": own, f"{B}::m": other}
    assert namespaces.pick(entries, f"{A}::m") is own
    own.versions = {}
    own.records = {1: ("UNAVAILABLE", "unloaded")}
    assert namespaces.pick(entries, f"{A}::m") is other
    assert namespaces.pick({f"{A}::m": own}, f"{A}::m") is own  # nothing else: its own (unavailable) one


def test_namespacing_flag(tmp_path):
    base = ["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    config = parse_args([*base, "--model-namespacing", "TRUE"], environ={})
    assert config.model_namespacing and config.frontend_processes == 1
    assert not parse_args(base, environ={}).model_namespacing
    with pytest.raises(SystemExit) as info:
        parse_args([*base, "--model-namespacing=true", "--frontend-processes", "2"], environ={})
    assert "--model-namespacing=true: frontend processes" in str(info.value)
