"""Every fuzz target (fuzz/targets/*.py) on its kept corpus, and on a short seeded run of random mutations
of it: what CI runs of the fuzzing (fuzz/README.md). A failure names the input file or the generated input,
with the target's traceback. Runs in a few seconds for all targets together."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ_DIR = Path(__file__).resolve().parents[3] / "fuzz"
sys.path.insert(0, str(FUZZ_DIR))
import harness  # noqa: E402

TARGETS = harness.target_names()
GENERATED = 200  # random inputs per target in the default suite (the same ones every run: seeded)


def _report(failures: list[harness.Failure]) -> str:
    return "\n\n".join(f"{f.source}: {f.data[:200]!r}\n{f.error}" for f in failures)


@pytest.mark.parametrize("name", TARGETS)
def test_kept_corpus_replays_clean(name: str) -> None:
    count, failures = harness.replay(name, timeout=20)
    assert count, f"fuzz target {name} has no kept corpus in fuzz/corpus/{name}/"
    assert not failures, _report(failures)


@pytest.mark.parametrize("name", TARGETS)
def test_a_brief_seeded_mutation_run_finds_nothing(name: str) -> None:
    res = harness.mutation_loop(name, runs=GENERATED, seed=20240601, timeout=20, max_failures=3)
    assert res.executions == GENERATED or res.failures
    assert not res.failures, _report(res.failures)
