"""The direct path's statistics (frontend_processes/stats_relay.py, direct_core.replay): what a frontend's local
scheduler records reaches the core's ModelStats as if the core had recorded it; rows wait at most FLUSH_S, a
pull is answered at once with the in-flight counts; a malformed row is dropped, never fatal."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from inferd.supervisor.frontend_processes import direct_core, stats_relay
from inferd.supervisor.metrics.model_statistics import StatsRegistry


def _core(serial: int = 7) -> tuple[Any, Any]:
    """A data plane's part replay reads: a manager with one loaded version (its serial and real ModelStats)."""
    stats = StatsRegistry().get("add_sub", 1)
    mv = SimpleNamespace(serial=serial, stats=stats)
    return SimpleNamespace(manager=SimpleNamespace(loaded_versions=lambda: [mv])), stats


def test_recorded_figures_replay_into_the_cores_statistics_alike():
    dp, relayed = _core()
    _, direct = _core()
    sent: list[Any] = []

    async def scenario() -> None:
        relay = stats_relay.StatsRelay(lambda doc, pull: sent.append((doc, pull)))
        rec = stats_relay.Recorder(7, relay)
        now = time.monotonic_ns()
        for sink in (rec, direct):  # the same calls on the relay's recorder and on a ModelStats directly
            sink.record_execution(2, 10, 20, 30)
            sink.record_successes([now - 5000, now - 4000], now - 3000, now, 10, 20, 30)
            sink.record_success(1, 900, 100, 10, 20, 30)
            sink.record_failure("REJECTED", 0)
            sink.record_failure("OTHER", 77)
        relay.flush()

    asyncio.run(scenario())
    assert [pull for _, pull in sent] == [0]
    direct_core.replay(dp, sent[0][0]["rows"])
    got, want = relayed.to_json(), direct.to_json()
    # last_inference is the wall clock (ms) when a row is applied; the replay runs a moment after the direct calls
    assert 0 <= got.pop("last_inference") - want.pop("last_inference") < 60_000
    assert got == want
    assert got["inference_stats"]["success"]["count"] == 3


def test_rows_leave_within_the_flush_interval_and_a_pull_is_answered_at_once():
    sent: list[Any] = []

    async def scenario() -> None:
        relay = stats_relay.StatsRelay(lambda doc, pull: sent.append((doc, pull)),
                                       lambda: {"inflight": {"7": {"i0": 2}}, "pending": {"7": 3}})
        relay.flush(pull=5)  # nothing recorded: still answered, with the counts
        stats_relay.Recorder(7, relay).record_failure("OTHER", 0)
        assert len(sent) == 1
        deadline = time.monotonic() + 10 * stats_relay.FLUSH_S + 5.0
        while len(sent) < 2:
            assert time.monotonic() < deadline, "recorded rows were never sent"
            await asyncio.sleep(stats_relay.FLUSH_S / 5)
        relay.close()

    asyncio.run(scenario())
    (first, pull), (second, zero) = sent
    assert pull == 5 and first == {"rows": [], "inflight": {"7": {"i0": 2}}, "pending": {"7": 3}}
    assert zero == 0 and second == {"rows": [[7, stats_relay.FAILURE, "OTHER", 0]]}
    assert direct_core.inflight_table(first["inflight"]) == {(7, "i0"): 2}
    assert direct_core.pending_table(first["pending"]) == {7: 3}


def test_rows_kept_while_unsent_are_bounded():
    async def scenario() -> int:
        relay = stats_relay.StatsRelay(lambda doc, pull: None)
        rec = stats_relay.Recorder(7, relay)
        for _ in range(stats_relay.MAX_ROWS + 500):
            rec.record_failure("OTHER", 0)
        kept = len(relay.rows)
        relay.close()
        return kept

    assert asyncio.run(scenario()) <= stats_relay.MAX_ROWS + 1


def test_malformed_or_unknown_rows_are_dropped(caplog):
    dp, stats = _core()
    direct_core.replay(dp, [[99, 0, 1, 2, 3, 4, 5, 6],  # a version unloaded since: dropped quietly
                            [7, stats_relay.SUCCESS, 1],  # too few arguments: logged, dropped
                            [7, 9, "x"],  # no such method: logged, dropped
                            [7, stats_relay.FAILURE, "OTHER", 5]])
    assert stats.to_json()["inference_stats"]["fail"]["count"] == 1
    assert "bad statistics row" in caplog.text


def test_tables_of_counts_ignore_what_is_not_a_count():
    assert direct_core.inflight_table({"7": {"i0": 1, "i1": "x", "i2": -1}, "8": [1]}) == {(7, "i0"): 1}
    assert direct_core.inflight_table("nonsense") == {}
    assert direct_core.pending_table({"7": 2, "8": None}) == {7: 2}
