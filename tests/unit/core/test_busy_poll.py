"""BusyPoll (`--busy-poll-us`) on a real event loop: it keeps the loop passing for its window after a
poke that came within the window of the one before, then lets it sleep; a lone poke does not poll; it
sleeps in 1 ms steps while every CPU is wanted, and never starts after close."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from inferd.supervisor.core.busy_poll import BusyPoll, runnable_processes

DEADLINE_S = 10.0  # generous: a busy 2-core machine may hold the loop back


async def wait_until_quiet(poll: BusyPoll) -> float:
    """Seconds until polling stopped (the loop keeps running other work meanwhile)."""
    start = time.monotonic()
    while poll.polling:
        assert time.monotonic() - start < DEADLINE_S, "busy polling never stopped"
        await asyncio.sleep(0.001)
    return time.monotonic() - start


def test_runnable_processes_counts_this_one():
    assert runnable_processes() >= 1


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        BusyPoll(0)


def test_polls_for_the_window_then_sleeps():
    async def main() -> None:
        poll = BusyPoll(30_000, cpus=1 << 20)  # as if CPUs were plenty: only the window stops it
        poll.poke()
        assert not poll.polling  # a lone request: nothing says another is coming
        poll.poke()
        assert poll.polling
        waited = await wait_until_quiet(poll)
        assert waited >= 0.025  # the window (30 ms) less the timer's granularity
        assert poll.passes > 0
        assert poll.stops_for_load == 0
        passes = poll.passes
        await asyncio.sleep(0.05)
        assert poll.passes == passes  # quiet: no pass without a poke

    asyncio.run(main())


def test_each_poke_extends_the_window():
    async def main() -> None:
        poll = BusyPoll(40_000, cpus=1 << 20)
        start = time.monotonic()
        poll.poke()
        poll.poke()
        await asyncio.sleep(0.03)
        assert poll.polling
        poll.poke()  # a request 30 ms in: polling goes on until 40 ms after it
        await wait_until_quiet(poll)
        assert time.monotonic() - start >= 0.065

    asyncio.run(main())


def test_sleeps_while_every_cpu_is_wanted():
    async def main() -> None:
        poll = BusyPoll(200_000, cpus=0)  # no CPU to spare: this process alone is one too many
        poll.poke()
        poll.poke()
        await wait_until_quiet(poll)
        assert poll.passes == 0  # never polled: slept 1 ms at a time until the window closed
        assert poll.stops_for_load >= 2

    asyncio.run(main())


def test_polls_only_with_a_cpu_to_spare():
    cpus = len(os.sched_getaffinity(0))

    async def main() -> None:
        poll = BusyPoll(20_000, cpus=cpus)
        poll.poke()
        poll.poke()
        await wait_until_quiet(poll)
        assert poll.passes > 0 or poll.stops_for_load > 0  # polled, or slept while the machine was busy

    asyncio.run(main())


def test_close_stops_polling_for_good():
    async def main() -> None:
        poll = BusyPoll(1_000_000, cpus=1 << 20)
        poll.poke()
        poll.poke()
        await asyncio.sleep(0.01)
        assert poll.polling
        poll.close()
        assert not poll.polling
        passes = poll.passes
        poll.poke()
        assert not poll.polling
        await asyncio.sleep(0.02)
        assert poll.passes == passes

    asyncio.run(main())


def test_other_work_runs_while_polling():
    async def main() -> None:
        poll = BusyPoll(200_000, cpus=1 << 20)
        poll.poke()
        poll.poke()
        done = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.02, done.set_result, "timer fired")
        assert await asyncio.wait_for(done, DEADLINE_S) == "timer fired"
        reader, writer = os.pipe()
        try:
            got = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().add_reader(reader, lambda: got.set_result(os.read(reader, 16)))
            os.write(writer, b"ping")
            assert await asyncio.wait_for(got, DEADLINE_S) == b"ping"
            asyncio.get_running_loop().remove_reader(reader)
        finally:
            os.close(reader)
            os.close(writer)
        assert poll.polling
        poll.close()

    asyncio.run(main())


def test_sparse_requests_never_poll():
    async def main() -> None:
        poll = BusyPoll(5_000, cpus=1 << 20)
        for _ in range(4):
            poll.poke()
            assert not poll.polling
            await asyncio.sleep(0.02)  # each request comes long after the window of the one before
        assert poll.passes == 0
        poll.poke()
        poll.poke()  # one soon after another: polling starts
        assert poll.polling
        await wait_until_quiet(poll)
        poll.close()

    asyncio.run(main())


def test_overlapping_requests_never_poll():
    async def main() -> None:
        poll = BusyPoll(20_000, cpus=1 << 20)
        for _ in range(10):
            poll.poke(alone=False)  # each found its model busy: concurrency above 1
            assert not poll.polling
        poll.poke()  # alone, but the one before was not: a burst's first request
        assert not poll.polling
        poll.poke()  # alone after alone, within the window: concurrency 1
        assert poll.polling
        start = time.monotonic()
        poll.poke(alone=False)  # does not extend the window
        await wait_until_quiet(poll)
        assert time.monotonic() - start < 1.0
        assert poll.passes > 0
        poll.close()

    asyncio.run(main())


def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path):
    from inferd.supervisor.core.busy_poll import cpu_quota, default_window_us

    none = tmp_path / "no-such-file"
    assert cpu_quota(tmp_path, none) is None  # no cgroup files: unknown, taken as unlimited
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(tmp_path, none) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # a container: its own cgroup is the root
    assert cpu_quota(tmp_path, none) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(v1, none) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    assert cpu_quota(v1, none) == 4.0
    assert default_window_us(2, None) == 1000
    assert default_window_us(1, None) == 0  # polling would take the worker's CPU
    assert default_window_us(16, 4.0) == 0  # polling would spend a container's quota


def test_cpu_quota_follows_this_process_cgroup_up(tmp_path):
    """A systemd service's CPUQuota= sits on its own cgroup (v2), or a parent slice's: the smallest counts."""
    from inferd.supervisor.core.busy_poll import cpu_quota

    root = tmp_path / "fs"
    service = root / "system.slice" / "inferd.service"
    service.mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "system.slice" / "cpu.max").write_text("max 100000\n")
    (service / "cpu.max").write_text("max 100000\n")
    me = tmp_path / "cgroup"
    me.write_text("0::/system.slice/inferd.service\n")
    assert cpu_quota(root, me) is None
    (service / "cpu.max").write_text("300000 100000\n")
    assert cpu_quota(root, me) == 3.0
    (root / "system.slice" / "cpu.max").write_text("50000 100000\n")
    assert cpu_quota(root, me) == 0.5
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "kubepods" / "pod1").mkdir(parents=True)
    (v1 / "cpu" / "kubepods" / "pod1" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "kubepods" / "pod1" / "cpu.cfs_period_us").write_text("100000\n")
    me.write_text("4:memory:/kubepods/pod1\n3:cpu,cpuacct:/kubepods/pod1\n0::/\n")
    assert cpu_quota(v1, me) == 2.0
