"""Spawning worker processes: a clean environment, the bootstrap line.

The worker sees only `<run_dir>/pypath` on its Python path (envs/worker_pypath.py makes it). The supervisor
itself never imports `inferd.worker` beyond `inferd.worker.wire`.

Processes are spawned from the event-loop thread (PR_SET_PDEATHSIG, set by the worker, is tied to the
thread that forked it) and their stdin pipe stays open as the lifeline: EOF means the supervisor is
gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferd.worker.wire.messages import WIRE_VERSION

from ..envs.worker_pypath import WORKER_MODULE, prepare_pypath
from . import cpu_threads

SOCKET_NAME = "workers.sock"


def clean_env(
    pypath: str,
    base_env: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    path_prefix: Sequence[str] = (),
) -> dict[str, str]:
    """The worker's environment: `base_env` without PYTHON*/CONDA_*, PYTHONPATH = the staging dir only.

    `extra_env` (e.g. what a conda environment needs) is applied last but cannot override the Python
    path settings; `path_prefix` directories are put in front of PATH.
    """
    env = {k: v for k, v in base_env.items() if not k.startswith(("PYTHON", "CONDA_"))}
    if extra_env:
        for key, value in extra_env.items():
            if key in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME"):
                continue
            env[key] = value
    if path_prefix:
        env["PATH"] = os.pathsep.join([*path_prefix, env.get("PATH", os.defpath)])
    env["PYTHONPATH"] = pypath
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # model print() output reaches the server log as it happens
    return env


@dataclass(frozen=True)
class Bootstrap:
    endpoint: str
    identity: str
    instance_name: str
    supervisor_pid: int
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    log_verbose: int = 0
    log_format: str = "default"  # the server's --log-format: the worker writes its lines in it

    def line(self) -> bytes:
        doc = {
            "wire_version": WIRE_VERSION,
            "endpoint": self.endpoint,
            "identity": self.identity,
            "instance_name": self.instance_name,
            "supervisor_pid": self.supervisor_pid,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "log_verbose": self.log_verbose,
            "log_format": self.log_format,
        }
        return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


class Launcher:
    """Spawns `<python> -s -m inferd.worker` processes for one run directory.

    `python`: the interpreter (the server's own by default, `<env>/bin/python` for an execution
    environment). `command` replaces the whole argv (tests use it to run a fake worker).
    `base_env` is the environment workers inherit from (default: this process's, read once here);
    `env_overrides` are set on top of it (e.g. CUDA_DEVICE_ORDER, so CUDA numbers GPUs as discovery did).
    """

    def __init__(
        self,
        run_dir: str,
        *,
        python: str | None = None,
        base_env: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
        env_overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.python = python or sys.executable
        self.pypath = prepare_pypath(self.run_dir)
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._base_env.update(env_overrides or {})
        self._command = list(command) if command else None

    def argv(self, python: str | None = None) -> list[str]:
        if self._command:
            return list(self._command)
        return [python or self.python, "-s", "-m", WORKER_MODULE]

    def env(
        self, extra_env: Mapping[str, str] | None = None, path_prefix: Sequence[str] = ()
    ) -> dict[str, str]:
        env = clean_env(self.pypath, self._base_env, extra_env, path_prefix)
        # fewer CPUs than the host: BLAS/OpenMP pools sized to them, where the environment says nothing
        # (host_policy.PinnedLauncher has `cpus`, the policy's; a plain launcher's workers run on ours)
        env.update(cpu_threads.thread_defaults(cpu_threads.worker_cpus(getattr(self, "cpus", None)), env))
        return env

    async def spawn(
        self,
        bootstrap: Bootstrap,
        *,
        python: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        path_prefix: Sequence[str] = (),
        cwd: str | None = None,
    ) -> asyncio.subprocess.Process:
        """Start a worker and write its bootstrap line; stdin stays open (the lifeline).

        Must be awaited on the event-loop thread. stdout/stderr are inherited.
        """
        proc = await asyncio.create_subprocess_exec(
            *self.argv(python),
            stdin=asyncio.subprocess.PIPE,
            stdout=None,
            stderr=None,
            env=self.env(extra_env, path_prefix),
            cwd=cwd,
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only; it drains workers
            close_fds=True,
        )
        assert proc.stdin is not None
        try:
            proc.stdin.write(bootstrap.line())
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the process died at once; its exit is reported by the caller's wait()
        return proc
