"""Every fuzz target (fuzz/targets/*.py) on its kept corpus, and on a short seeded run of random mutations
of it: what CI runs of the fuzzing (fuzz/README.md). A failure names the input file or the generated input,
with the target's traceback. Runs in a few seconds for all targets together."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FUZZ_DIR = Path(__file__).resolve().parents[3] / "fuzz"
sys.path.insert(0, str(FUZZ_DIR))
import harness  # noqa: E402

TARGETS = harness.target_names()
GENERATED = 200  # random inputs per target in the default suite (the same ones every run: seeded)


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A target's setup() may quiet the inferd loggers for its own process (fuzz/run.py runs each target in
    one); replayed here, in the suite's process, that must not outlive the test (later tests read caplog)."""
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == "inferd" or name.startswith("inferd.")] + [logging.getLogger("inferd")]
    saved = [(lg, lg.level, lg.propagate, list(lg.handlers), lg.disabled) for lg in loggers]
    yield
    for lg, level, propagate, handlers, disabled in saved:
        lg.setLevel(level)
        lg.propagate = propagate
        lg.handlers[:] = handlers
        lg.disabled = disabled
    for name in list(logging.Logger.manager.loggerDict):  # loggers a target made meanwhile
        lg = logging.getLogger(name)
        if (name == "inferd" or name.startswith("inferd.")) and lg not in loggers:
            lg.setLevel(logging.NOTSET)
            lg.propagate = True
            lg.handlers[:] = []


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
