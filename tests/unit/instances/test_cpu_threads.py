"""supervisor/instances/cpu_threads.py: which thread variables a worker's environment gets."""

from __future__ import annotations

import os

import pytest
from inferd.supervisor.instances import cpu_threads
from inferd.supervisor.instances.launcher import Launcher

ALL = cpu_threads.THREAD_VARS


def test_fewer_cpus_than_the_host_set_every_variable_the_environment_lacks():
    got = cpu_threads.thread_defaults(frozenset({2, 3}), {"MKL_NUM_THREADS": "8"}, host_cpus=8)
    assert got == {name: "2" for name in ALL if name != "MKL_NUM_THREADS"}


def test_the_hosts_every_cpu_or_an_unknown_count_sets_nothing():
    assert cpu_threads.thread_defaults(frozenset(range(8)), {}, host_cpus=8) == {}
    assert cpu_threads.thread_defaults(frozenset({0}), {}, host_cpus=0) == {}
    assert cpu_threads.thread_defaults(frozenset(), {}, host_cpus=8) == {}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity")
def test_a_policy_counts_only_the_cpus_this_server_may_use():
    own = frozenset(os.sched_getaffinity(0))
    assert cpu_threads.worker_cpus(None) == own
    assert cpu_threads.worker_cpus(own | {100000}) == own
    assert cpu_threads.worker_cpus(frozenset({100000})) == {100000}  # none of ours: the kernel will refuse it


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or (os.cpu_count() or 0) < 2, reason="needs 2 CPUs")
def test_the_launchers_environment(tmp_path):
    launcher = Launcher(str(tmp_path), base_env={"PATH": "/bin", "OMP_NUM_THREADS": "5"})
    launcher.cpus = frozenset({min(os.sched_getaffinity(0))})
    env = launcher.env({"NUMEXPR_NUM_THREADS": "7"})
    assert env["OMP_NUM_THREADS"] == "5" and env["NUMEXPR_NUM_THREADS"] == "7"  # the user's stay
    assert env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["VECLIB_MAXIMUM_THREADS"] == "1"
