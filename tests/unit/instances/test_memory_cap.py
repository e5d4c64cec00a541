"""instances/memory_cap.py (sizes, the model parameter, private RSS) and instances/cgroup_memory.py's file
protocol. The cgroup tests run on a directory standing in for a delegated cgroup v2 group (this host has
none): they check which files are read and written, not what the kernel does with them."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from inferd.supervisor.core.models import _unready_reason
from inferd.supervisor.instances import cgroup_memory, memory_cap
from inferd.supervisor.repository import config as repo_config
from inferd.worker.wire.errors import ErrorCode, InferdError

MiB = 1 << 20


@pytest.mark.parametrize(("text", "size"), [
    ("512M", 512 * MiB), ("512MiB", 512 * MiB), ("512mb", 512 * MiB), ("2G", 2 << 30), ("1.5G", 3 << 29),
    ("4096K", 4 * MiB), (str(300 * MiB), 300 * MiB), ("0", None), ("none", None), ("", None)])
def test_sizes(text, size):
    assert memory_cap.parse_size(text) == size


@pytest.mark.parametrize("text", ["12X", "-1", "M", "1e9", "100", "512 M B"])
def test_malformed_sizes_are_refused(text):
    with pytest.raises(ValueError, match="is not a memory size|is below 1 MiB"):
        memory_cap.parse_size(text)


@pytest.mark.parametrize("text", ["99999999999999999999T", "2000000000G"])
def test_sizes_beyond_any_host_are_refused(text):
    # (they used to pass, then crash the worker's start: prlimit() raised OverflowError on them)
    with pytest.raises(ValueError, match="above 1 EiB"):
        memory_cap.parse_size(text)
    memory_cap.set_rlimit_data(os.getpid(), 10**42)  # best effort: never raises (overflows before any change)


def _parameters(value: str | None):
    text = 'name: "m"\nbackend: "python"\n'
    if value is not None:
        text += 'parameters { key: "INFERD_INSTANCE_MEMORY_LIMIT" value: { string_value: "%s" } }' % value
    return repo_config.parse_pbtxt(text).parameters


def test_the_model_parameter_overrides_the_server_default():
    assert memory_cap.model_limit(_parameters(None), 200 * MiB) == 200 * MiB
    assert memory_cap.model_limit(_parameters("1G"), 200 * MiB) == 1 << 30
    assert memory_cap.model_limit(_parameters("64M"), None) == 64 * MiB
    assert memory_cap.model_limit(_parameters("none"), 200 * MiB) is None
    with pytest.raises(ValueError, match="parameter INFERD_INSTANCE_MEMORY_LIMIT: 'lots' is not a memory size"):
        memory_cap.model_limit(_parameters("lots"), None)


def test_private_rss_sees_touched_memory_and_not_mapped_files():
    before = memory_cap.private_rss(os.getpid())
    block = np.ones(64 * MiB, dtype=np.uint8)  # touched: resident
    grown = memory_cap.private_rss(os.getpid())
    assert grown - before >= 60 * MiB
    del block
    assert memory_cap.private_rss(2 ** 22 + 12345) is None  # no such process


def test_the_error_names_the_cap():
    assert memory_cap.exceeded("m", "m_0", 512 * MiB, 530 * MiB) == (
        "model 'm' instance 'm_0' exceeded its memory limit of 512 MiB (RSS 530 MiB)")


def test_rlimit_data_is_generous():
    assert memory_cap.rlimit_data(200 * MiB) == 400 * MiB + (1 << 30)


def _fake_proc(tmp_path, cgroup: str, mountinfo: str) -> str:
    proc = tmp_path / "proc_self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return str(proc)


def test_own_cgroup_dir_from_proc(tmp_path):
    v2 = "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    assert cgroup_memory.own_cgroup_dir(_fake_proc(tmp_path, "0::/system.slice/inferd.service\n", v2)) == (
        "/sys/fs/cgroup/system.slice/inferd.service")
    hybrid = ("40 30 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
              "41 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    assert cgroup_memory.own_cgroup_dir(_fake_proc(tmp_path / "b", "4:memory:/x\n0::/\n", hybrid)) == (
        "/sys/fs/cgroup/unified")
    v1_only = "40 30 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    assert cgroup_memory.own_cgroup_dir(_fake_proc(tmp_path / "c", "4:memory:/x\n", v1_only)) is None


def _group(path, controllers: str, enabled: str = ""):
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(enabled + "\n")
    (path / "cgroup.procs").write_text("")
    return path


def test_delegation_moves_the_server_into_a_leaf_and_enables_memory(tmp_path):
    own = _group(tmp_path / "svc", "cpu io memory pids")
    parent, why = cgroup_memory.delegate(str(own), 4242)
    assert why == "" and parent is not None and parent.path == str(own)
    assert (own / "inferd-supervisor" / "cgroup.procs").read_text() == "4242"
    assert (own / "cgroup.subtree_control").read_text() == "+memory"
    group = parent.worker_group("inferd-1-w7", 200 * MiB, 5151)
    assert group is not None
    made = own / "inferd-1-w7"
    knobs = ("memory.max", "memory.swap.max", "memory.oom.group", "cgroup.procs")
    assert {f: (made / f).read_text() for f in knobs} == {
        "memory.max": str(200 * MiB), "memory.swap.max": "0", "memory.oom.group": "1", "cgroup.procs": "5151"}
    assert group.oom_kills() == 0
    (made / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n")
    assert group.oom_kills() == 1


def test_no_delegation_without_the_memory_controller_or_when_it_cannot_be_enabled(tmp_path):
    parent, why = cgroup_memory.delegate(str(_group(tmp_path / "a", "cpu pids")), 1)
    assert parent is None and "memory controller is not delegated" in why
    assert cgroup_memory.delegate(None, 1) == (None, "no cgroup v2 group (cgroup v1 host or no /proc)")
    busy = _group(tmp_path / "b", "memory")
    os.unlink(busy / "cgroup.subtree_control")  # readable, but a write fails, as EBUSY does with other processes
    os.symlink("/proc/version", busy / "cgroup.subtree_control")  # in the group
    parent, why = cgroup_memory.delegate(str(busy), 1)
    assert parent is None and "cannot enable the memory controller below" in why, why
    assert (busy / "cgroup.procs").read_text() == "1"  # the server moved back (cgroupfs then removes the leaf)


def test_memory_already_enabled_below_the_group_is_used_as_it_is(tmp_path):
    own = _group(tmp_path / "svc", "memory", "memory")
    parent, why = cgroup_memory.delegate(str(own), 1)
    assert parent is not None and not (own / "inferd-supervisor").exists()


def test_the_unready_reason_names_each_instance_s_last_error():
    err = InferdError(ErrorCode.UNAVAILABLE, "model 'm' instance 'm_0' exceeded its memory limit of 200 MiB")
    mv = SimpleNamespace(instances=[
        SimpleNamespace(name="m_0", ready=False, state=SimpleNamespace(value="restarting"), last_error=err),
        SimpleNamespace(name="m_1", ready=False, state=SimpleNamespace(value="starting"), last_error=None)])
    assert _unready_reason(mv) == ("no ready instance; instance 'm_0' is restarting: model 'm' instance 'm_0' "
                                   "exceeded its memory limit of 200 MiB")
