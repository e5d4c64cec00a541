"""Triton's host policies (--host-policy <name>,<setting>=<value>): the CPUs a model instance's worker
runs on.

Triton applies a policy to the thread that creates an instance, and the Python backend's stub, forked
from that thread, inherits it (checked on Triton 2.51: its stub runs on the policy's CPUs); inferd applies
it to the instance's worker process. An instance's policy is its group's `host_policy`, else "cpu"
(KIND_CPU), "gpu_<device>" (KIND_GPU) or "model" (KIND_MODEL), as in Triton; a name no --host-policy
gives leaves the worker as it is.
- cpu-cores=<first>-<last>[,<first>-<last>...]: the worker's CPU affinity;
- numa-node=<n>: the node's CPUs (/sys/devices/system/node), so that Linux's local allocation keeps the
  worker's memory on that node. Triton binds the memory itself (MPOL_BIND): where the node is full,
  Triton's allocation fails and inferd's comes from another node. With cpu-cores too, cpu-cores wins.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from .launcher import Bootstrap, Launcher

SETTINGS = ("numa-node", "cpu-cores")
NODE_DIR = "/sys/devices/system/node"


def parse(values: list[str]) -> dict[str, dict[str, str]]:
    """--host-policy values -> {policy: {setting: value}} (a later value of a setting wins, as in Triton).
    ValueError with tritonserver's words for what it refuses at start, and for a malformed cpu-cores or
    numa-node value, which Triton refuses only when an instance uses the policy."""
    policies: dict[str, dict[str, str]] = {}
    for text in values:
        name, comma, rest = text.partition(",")
        setting, eq, value = rest.partition("=")
        if not (comma and eq and name and setting and value):
            raise ValueError(f"--host-policy option format is '<policy name>,<setting>=<value>'. Got {text}")
        if setting not in SETTINGS:
            raise ValueError(f"--host-policy {text}: Unsupported host policy setting '{setting}' is specified, "
                             "supported settings are 'numa-node', 'cpu-cores'")
        try:
            _parse_cpu_cores(value) if setting == "cpu-cores" else _int(value, "numa-node")
        except ValueError as exc:
            raise ValueError(f"--host-policy {text}: {exc}") from None
        policies.setdefault(name, {})[setting] = value
    return policies


def _int(text: str, setting: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"Parsing '{setting}' value: Can't parse '{text}' to integer") from None


def _parse_cpu_cores(text: str) -> frozenset[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not dash:
            raise ValueError(f"host policy setting 'cpu-cores' format is '<lower_cpu_core_id>-<upper_cpu_core_id>'. "
                             f"Got {part}")
        cpus.update(range(_int(first, "cpu-cores"), _int(last, "cpu-cores") + 1))
    return frozenset(cpus)


def policy_name(group_policy: str, kind: str, device: int) -> str:
    """Triton's name for an instance's policy: the group's, else one per kind (and GPU)."""
    if group_policy:
        return group_policy
    return {"GPU": f"gpu_{device}", "MODEL": "model"}.get(kind, "cpu")


def _node_cpus(node: int) -> frozenset[int]:
    try:
        with open(os.path.join(NODE_DIR, f"node{node}", "cpulist")) as f:
            text = f.read().strip()
    except OSError:
        raise InferdError(ErrorCode.INTERNAL, f"Unable to set NUMA memory policy: no NUMA node {node} "
                          f"({NODE_DIR}/node{node})") from None
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def cpus_of(policy: Mapping[str, str] | None) -> frozenset[int] | None:
    """The CPUs a policy's workers run on; None: the policy leaves them as they are."""
    if not policy:
        return None
    if "cpu-cores" in policy:
        return _parse_cpu_cores(policy["cpu-cores"])
    if "numa-node" in policy:
        return _node_cpus(_int(policy["numa-node"], "numa-node"))
    return None


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread the process has now; threads it starts later inherit from the one starting them."""
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tasks = [pid]
    for tid in tasks:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # the thread (or the process) is gone already: its exit is reported elsewhere


class PinnedLauncher(Launcher):
    """A Launcher whose workers run on `cpus` (it shares the launcher it wraps: run dir, environment)."""

    def __init__(self, inner: Launcher, cpus: frozenset[int]) -> None:
        self.__dict__.update(inner.__dict__)  # instead of Launcher.__init__: the same run dir and environment
        self.cpus = cpus

    async def spawn(self, bootstrap: Bootstrap, **kw: Any) -> asyncio.subprocess.Process:
        proc = await super().spawn(bootstrap, **kw)
        try:
            pin(proc.pid, self.cpus)
        except OSError as exc:  # no CPU of the set is available to this server
            proc.kill()
            await proc.wait()
            raise InferdError(ErrorCode.INTERNAL, f"Unable to set NUMA thread affinity: {exc.strerror or exc} "
                              f"(CPUs {sorted(self.cpus)})") from None
        return proc
