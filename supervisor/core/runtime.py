"""The process-wide resources every model instance shares: the ZeroMQ channel, the worker launcher, the
shared-memory pools, the conda-pack environments and the --host-fd link; started once, closed at exit."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from .. import rundir
from ..config import ServerConfig
from ..envs import EnvironmentManager, EnvLimits
from ..instances.channel import Channel
from ..instances.external import HostLink
from ..instances.launcher import Launcher
from ..memory.client_shm import ClientShm
from ..memory.shm_pool import ShmPool
from ..scheduler.rate_limiter import ExplicitResource, RateLimiter


@dataclass
class Runtime:
    """Process-wide resources the instances share."""

    run_dir: str
    owns_run_dir: bool
    channel: Channel
    launcher: Launcher
    pool: ShmPool
    client_shm: ClientShm
    envs: EnvironmentManager | None = None  # EXECUTION_ENV_PATH environments
    host: HostLink | None = None  # --host-fd: the process hosting backend "external" models
    rate_limiter: RateLimiter | None = None  # --rate-limit=execution_count: shared by every model's scheduler

    @classmethod
    async def start(cls, config: ServerConfig) -> Runtime:
        # workers count GPUs in PCI bus order, as NVML does (gpus.py), unless the server's environment says otherwise
        overrides = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if config.cuda_device_order is None else {}
        ShmPool.sweep_stale()
        rundir.sweep_stale()
        channel = Channel(config.run_dir)
        channel.open()
        envs = EnvironmentManager(config.env_cache_dir or os.path.expanduser("~/.cache/inferd/envs"),
                                  max_bytes=config.env_cache_max_bytes,
                                  limits=EnvLimits(config.env_unpack_max_bytes, config.env_unpack_max_members))
        launcher = Launcher(config.run_dir, env_overrides=overrides)
        limiter = (RateLimiter(ExplicitResource(*r) for r in config.rate_limit_resources)
                   if config.rate_limit == "execution_count" else None)
        return cls(config.run_dir, config.owns_run_dir, channel, launcher, ShmPool(), ClientShm(), envs,
                   rate_limiter=limiter)

    async def close(self) -> None:
        if self.host is not None:
            await self.host.close()
        self.pool.close()
        self.channel.close()
        if self.envs is not None:
            self.envs.close()
        if self.owns_run_dir:
            rundir.remove(self.run_dir)
        else:
            shutil.rmtree(os.path.join(self.run_dir, "overrides"), ignore_errors=True)
