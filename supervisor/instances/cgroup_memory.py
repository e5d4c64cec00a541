"""Memory caps enforced by cgroup v2, where this process may create child groups with the memory controller.

Each capped worker gets a group of its own, `<our cgroup>/inferd-<supervisor pid>-<worker identity>`, with
memory.max = the cap, memory.swap.max = 0 and memory.oom.group = 1: over the cap the kernel reclaims, then
OOM-kills the worker; memory.events' oom_kill tells the supervisor that the kernel did it for the cap.

cgroup v2 forbids processes in a group whose children have controllers enabled ("no internal processes"),
so when the memory controller is not enabled below our group yet, the supervisor moves itself into a leaf
`inferd-supervisor` and enables it; where that fails (other processes share the group, no delegation, a
cgroup v1 host, a container without a writable cgroupfs) nothing is changed and the RSS watchdog
(memory_cap.py) enforces the caps instead. Checked once, on the first capped worker.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("inferd.instances")

LEAF = "inferd-supervisor"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def own_cgroup_dir(proc_self: str = "/proc/self") -> str | None:
    """The directory of this process's cgroup v2 group (None on a cgroup v1-only host or without /proc)."""
    try:
        lines = _read(os.path.join(proc_self, "cgroup")).splitlines()
        mounts = _read(os.path.join(proc_self, "mountinfo")).splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if rel is None:
        return None
    for line in mounts:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or not tail.startswith("cgroup2 ") or len(fields) < 5:
            continue
        root, mount = fields[3], fields[4]
        if root != "/" and not (rel == root or rel.startswith(root + "/")):
            continue
        inner = rel[len(root):] if root != "/" else rel
        return os.path.normpath(mount + "/" + inner.lstrip("/"))
    return None


class CgroupParent:
    """A group whose children may have the memory controller; workers' groups are made here."""

    def __init__(self, path: str) -> None:
        self.path = path

    def worker_group(self, name: str, cap: int, pid: int) -> WorkerGroup | None:
        """A new group holding `pid` capped at `cap` bytes; None (logged) when the kernel refuses."""
        path = os.path.join(self.path, name)
        try:
            os.mkdir(path)
            _write(os.path.join(path, "memory.max"), str(cap))
            for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                try:
                    _write(os.path.join(path, knob), value)
                except OSError:
                    pass  # no swap accounting, an older kernel: the cap still holds
            _write(os.path.join(path, "cgroup.procs"), str(pid))
        except OSError as exc:
            log.warning("cgroup %s: %s; the RSS watchdog enforces this worker's memory limit", path, exc)
            try:
                os.rmdir(path)
            except OSError:
                pass
            return None
        return WorkerGroup(path)


class WorkerGroup:
    """One worker's group."""

    def __init__(self, path: str) -> None:
        self.path = path

    def oom_kills(self) -> int:
        try:
            for line in _read(os.path.join(self.path, "memory.events")).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """After the worker was reaped (a group with processes cannot be removed)."""
        try:
            os.rmdir(self.path)
        except OSError as exc:
            log.debug("cgroup %s not removed: %s", self.path, exc)


def delegate(own: str | None, pid: int) -> tuple[CgroupParent | None, str]:
    """The parent for workers' groups, set up below `own` (this process's group) if it can be: (parent,
    '') or (None, why not)."""
    if own is None:
        return None, "no cgroup v2 group (cgroup v1 host or no /proc)"
    try:
        controllers = _read(os.path.join(own, "cgroup.controllers")).split()
        enabled = _read(os.path.join(own, "cgroup.subtree_control")).split()
    except OSError as exc:
        return None, f"{own} unreadable ({exc.strerror or exc})"
    if "memory" not in controllers:
        return None, f"the memory controller is not delegated to {own}"
    if not os.access(own, os.W_OK) or not os.access(os.path.join(own, "cgroup.subtree_control"), os.W_OK):
        return None, f"{own} is not writable"
    if "memory" in enabled:
        return CgroupParent(own), ""
    leaf = os.path.join(own, LEAF)
    try:
        os.makedirs(leaf, exist_ok=True)
        _write(os.path.join(leaf, "cgroup.procs"), str(pid))
    except OSError as exc:
        return None, f"cannot move the server into {leaf} ({exc.strerror or exc})"
    try:
        _write(os.path.join(own, "cgroup.subtree_control"), "+memory")
    except OSError as exc:  # EBUSY: other processes live in our group; put ourselves back
        try:
            _write(os.path.join(own, "cgroup.procs"), str(pid))
            os.rmdir(leaf)
        except OSError:
            pass
        return None, f"cannot enable the memory controller below {own} ({exc.strerror or exc})"
    return CgroupParent(own), ""


_checked = False
_parent: CgroupParent | None = None


def parent() -> CgroupParent | None:
    """The process-wide parent, found (and logged) on first use."""
    global _checked, _parent
    if not _checked:
        _checked = True
        found, why = delegate(own_cgroup_dir(), os.getpid())
        _parent = found
        if found is not None:
            log.info("instance memory limits: enforced by cgroup v2 below %s", found.path)
        else:
            log.info("instance memory limits: enforced by an RSS watchdog and RLIMIT_DATA (cgroup v2: %s)", why)
    return _parent
