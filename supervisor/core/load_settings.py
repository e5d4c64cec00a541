"""What the model loader needs from the server's configuration, built once at start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config import ServerConfig, WorkerTimings
from ..repository.agents import DEFAULT_DIRECTORY as DEFAULT_AGENT_DIRECTORY
from ..repository.python_backends import DEFAULT_DIRECTORY as DEFAULT_BACKEND_DIRECTORY
from ..repository.sources import CloudSettings, Repositories
from .runtime import Runtime


@dataclass(frozen=True)
class LoaderSettings:
    repositories: tuple[str, ...]
    disable_autocomplete: bool
    max_queue_size: int
    unload_drain_s: float
    timings: WorkerTimings
    log_verbose: int
    runtime: Runtime
    gpu_ids: tuple[int, ...] = ()  # the GPUs discovery found (CUDA numbering); none: KIND_AUTO is CPU
    model_config_name: str = ""  # --model-config-name: <model>/configs/<name>.pbtxt where it exists
    load_retries: int = 0  # --model-load-retry-count
    repoagent_directory: str = DEFAULT_AGENT_DIRECTORY  # --repoagent-directory (named when an agent is missing)
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY  # --backend-directory: Python-based backends
    load_threads: int = 4  # --model-load-thread-count: models whose workers start at once
    host_policies: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # --host-policy
    repos: Repositories = None  # type: ignore[assignment]  # built from `repositories` when not given

    def __post_init__(self) -> None:
        if self.repos is None:
            object.__setattr__(self, "repos", Repositories(self.repositories))

    @classmethod
    def from_config(cls, config: ServerConfig, runtime: Runtime, gpu_ids: tuple[int, ...] = ()) -> LoaderSettings:
        cloud = None
        if config.cloud_credentials is not None:
            cloud = CloudSettings(config.cloud_credentials, config.cloud_cache_dir, config.cloud_timeout_secs)
        return cls(config.model_repositories, config.disable_auto_complete_config, config.max_queue_size,
                   config.exit_timeout_secs, config.worker, config.log_verbose, runtime, gpu_ids=gpu_ids,
                   model_config_name=config.model_config_name, load_retries=config.model_load_retry_count,
                   repoagent_directory=config.repoagent_directory, load_threads=config.model_load_thread_count,
                   backend_directory=config.backend_directory,
                   host_policies=config.host_policies,
                   repos=Repositories(config.model_repositories, cloud,
                                      namespacing=config.model_namespacing))
