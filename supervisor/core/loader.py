"""Glue between the model manager and the layers below it: plans a load from the repository (config
files, normalisation, versions) and makes its instances (workers) over the shared runtime (runtime.py).
Keeping it here leaves ModelManager about lifecycle only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from ..envs import ExecEnv
from ..instances import host_policy, memory_cap, recycle
from ..instances.external import BACKEND as EXTERNAL_BACKEND
from ..instances.external import ExternalLauncher
from ..instances.instance import Instance, run_autocomplete
from ..repository import agents, autocomplete, layout, metadata, normalize, python_backends, versions
from ..repository import config as repo_config
from ..scheduler.rate_limiter import LimiterSpec
from . import classification, overrides
from .load_settings import LoaderSettings

_KIND_NAMES = {0: "CPU", 1: "GPU", 2: "CPU", 3: "MODEL"}  # KIND_AUTO resolves before this point
# backends whose worker completes the config from the model (Python: auto_complete_config; ORT/TRT: the model file;
# vLLM: vllm_backend's inputs and outputs, decoupled)
_AUTOCOMPLETE_BACKENDS = ("python", "onnxruntime", "tensorrt", "vllm")


@dataclass
class LoadPlan:
    name: str
    source: layout.ModelSource
    proto: Any  # normalised inference.ModelConfig
    config: dict[str, Any]  # its Triton JSON rendering
    config_json: str
    versions: tuple[int, ...]
    metadata_base: dict[str, Any]
    env: ExecEnv | None = None  # the model's EXECUTION_ENV_PATH environment, resolved once per load
    labels: classification.Labels = field(default_factory=dict)  # outputs' label_filename files, read once
    override_root: str | None = None  # the directory the load's `file:` parameters were written to (overrides.py)
    namespace: str = ""  # with --model-namespacing: the repository it was loaded from (core/namespaces.py)
    backend_dir: str = ""  # a Python-based backend's directory (python_backends.py): its model.py runs the model

    @property
    def is_ensemble(self) -> bool:
        return bool(normalize.is_ensemble(self.proto))


async def _resolve_env(settings: LoaderSettings, name: str, cfg: Any, model_dir: str) -> ExecEnv | None:
    """EXECUTION_ENV_PATH (after $$TRITON_MODEL_DIRECTORY substitution; relative: to the model dir)."""
    param = cfg.parameters.get(normalize.EXECUTION_ENV_PATH)
    envs = settings.runtime.envs
    if param is None or not param.string_value or envs is None:
        return None
    return await envs.resolve(name, os.path.join(model_dir, param.string_value))


def release_env(settings: LoaderSettings, name: str) -> None:
    """An unloaded model no longer keeps its environment from eviction."""
    if settings.runtime.envs is not None:
        settings.runtime.envs.release(name)


def _env_kwargs(env: ExecEnv | None) -> dict[str, Any]:
    if env is None:
        return {}
    return {"python": env.python, "extra_env": env.extra_env, "path_prefix": env.path_prefix}


def check_model_name(name: str) -> None:
    layout.validate_model_name(name)


def list_model_names(settings: LoaderSettings) -> list[str]:
    return settings.repos.list_models().all_names()


def discard_override(plan: LoadPlan | None) -> None:
    """Remove the directory of a plan's `file:` parameters (once no instance runs from it)."""
    if plan is not None:
        overrides.discard(plan.override_root)


async def plan_load(settings: LoaderSettings, name: str, config_override: str | None,
                    files: dict[str, bytes] | None, root: str = "") -> LoadPlan:
    """The load's plan; with `files`, a private model directory holding them that the caller owns (and
    removes with discard_override), except when this raises: then it is gone already. `root`: the one
    repository to read it from (--model-namespacing), else every repository."""
    source = await settings.repos.find_model_async(name, settings.model_config_name, root)
    if not files:
        return await _plan(settings, name, source, config_override, None)
    root = overrides.write(settings.runtime.run_dir, source.name, files)
    try:
        source = layout.read_model(root, source.name, settings.model_config_name)
        return await _plan(settings, name, source, config_override, root)
    except BaseException:
        overrides.discard(root)
        raise


async def _plan(settings: LoaderSettings, name: str, source: layout.ModelSource, config_override: str | None,
                override_root: str | None) -> LoadPlan:
    if config_override is not None:
        cfg = repo_config.parse_json_config(config_override)
    else:
        cfg = repo_config.load_config(source, settings.disable_autocomplete)
    if cfg.HasField("model_repository_agents"):  # as Triton: on the config as written, before normalising
        await _run_agents(settings, name, cfg, source.path)
    cfg = normalize.normalize(cfg, source, gpu_ids=settings.gpu_ids)
    if not source.versions and not normalize.is_ensemble(cfg):
        raise InferdError(ErrorCode.INVALID_ARG,
                          "failed to load '%s': no version directory found in %s" % (name, source.path))
    # a backend inferd does not have: a Python-based one from --backend-directory, or Triton's load error
    backend_dir = "" if normalize.is_ensemble(cfg) else python_backends.resolve(
        cfg, source.path, max(source.versions), settings.backend_directory)
    env = await _resolve_env(settings, name, cfg, source.path)
    python_code = backend_dir or (source.path if cfg.backend == "python" else "")
    if ((cfg.backend in _AUTOCOMPLETE_BACKENDS or backend_dir)
            and autocomplete.needs_autocomplete(cfg, settings.disable_autocomplete)
            and not (python_code and not _mentions_auto_complete(python_code))):
        rt = settings.runtime
        completed = await run_autocomplete(
            m.AutoComplete(model_name=name, model_dir=source.path, version=str(max(source.versions)),
                           config_json=repo_config.to_json(cfg), backend="python" if backend_dir else cfg.backend,
                           backend_dir=backend_dir),
            channel=rt.channel, launcher=rt.launcher, timings=settings.timings,
            log_verbose=settings.log_verbose, **_env_kwargs(env))
        cfg = autocomplete.apply_autocompleted(cfg, completed)
    cfg = normalize.normalize(cfg, source, gpu_ids=settings.gpu_ids)
    if backend_dir:  # (what auto-complete returned keeps the runtime Triton gives such a model)
        python_backends.resolve(cfg, source.path, max(source.versions), settings.backend_directory)
    chosen = versions.select_versions(name, cfg.version_policy, source.versions).versions
    config = repo_config.to_json_dict(cfg)
    meta = metadata.model_metadata(cfg, [])
    meta.pop("versions", None)
    labels = classification.load_labels(source.path, config)
    return LoadPlan(name, source, cfg, config, repo_config.to_json(cfg), chosen, meta, env, labels, override_root,
                    backend_dir=backend_dir)


async def _run_agents(settings: LoaderSettings, name: str, cfg: Any, model_dir: str) -> None:
    """The config's repository agents (checksums read whole files: off the event loop)."""
    try:
        await asyncio.to_thread(agents.run_load_agents, cfg, model_dir, settings.repoagent_directory)
    except agents.AgentError as exc:
        raise agents.PollFailed(name, str(exc)) from None


def _mentions_auto_complete(model_dir: str, max_bytes: int = 4 << 20) -> bool:
    """Whether any Python file of the model could define `auto_complete_config`.

    Triton calls it only when the model class has it; when no source file in the model directory or
    its version directories names it, the throw-away auto-complete worker (a whole process start)
    is skipped. A method inherited from an installed package is the one case this misses.
    """
    needle = b"auto_complete_config"
    for root, dirs, files in os.walk(model_dir):
        if os.path.relpath(root, model_dir).count(os.sep) >= 2:
            dirs[:] = []  # model.py lives in <model>/<version>/; helper packages one level below
        for f in files:
            if not f.endswith(".py"):
                continue
            try:
                with open(os.path.join(root, f), "rb") as fh:
                    if needle in fh.read(max_bytes):
                        return True
            except OSError:
                return True  # unreadable: let the worker decide
    return False


def make_instances(settings: LoaderSettings, plan: LoadPlan, version: int) -> list[Instance]:
    rt = settings.runtime
    out: list[Instance] = []
    try:  # the model's own memory cap, else the server's --instance-memory-limit
        cap = memory_cap.model_limit(plan.proto.parameters, settings.timings.memory_limit_bytes)
    except ValueError as exc:
        raise InferdError(ErrorCode.INVALID_ARG, f"model '{plan.name}': {exc}") from None
    timings = (settings.timings if cap == settings.timings.memory_limit_bytes
               else dataclasses.replace(settings.timings, memory_limit_bytes=cap))
    try:  # the model's INFERD_MAX_REQUESTS / INFERD_MAX_AGE, else the server's (instances/recycle.py)
        timings = recycle.model_timings(plan.proto.parameters, timings)
    except ValueError as exc:
        raise InferdError(ErrorCode.INVALID_ARG, f"model '{plan.name}': {exc}") from None
    for group in plan.proto.instance_group:
        # KIND_GPU: `count` instances on each listed GPU (normalize lists every GPU when the config lists none)
        devices = list(group.gpus) if group.kind == normalize.KIND_GPU and group.gpus else [0]
        index = 0
        for device in devices:
            kind = _KIND_NAMES.get(group.kind, "CPU")
            # --host-policy: the CPUs of the instance's workers (InferdError for a NUMA node not found)
            cpus = host_policy.cpus_of(settings.host_policies.get(host_policy.policy_name(group.host_policy, kind,
                                                                                            device)))
            for k in range(group.count):
                load = m.LoadModel(
                    model_name=plan.name, model_dir=plan.source.path, version=str(version),
                    config_json=plan.config_json, backend="python" if plan.backend_dir else plan.proto.backend,
                    backend_dir=plan.backend_dir,
                    instance_name="%s_%d" % (group.name, index if len(devices) > 1 else k),
                    instance_kind=kind, device_id=device)
                launcher = (ExternalLauncher(rt.host, plan.name) if plan.proto.backend == EXTERNAL_BACKEND
                            else rt.launcher if cpus is None else host_policy.PinnedLauncher(rt.launcher, cpus))
                out.append(Instance(load, channel=rt.channel, launcher=launcher, timings=timings,
                                    pool=rt.pool, log_verbose=settings.log_verbose, passive=group.passive,
                                    rate_limiter=_rate_limiter(group), **_env_kwargs(plan.env)))
                index += 1
    return out


def _rate_limiter(group: Any) -> LimiterSpec | None:
    """The group's `rate_limiter` (None without one: its instances are not rate limited)."""
    if not group.HasField("rate_limiter"):
        return None
    rl = group.rate_limiter
    return LimiterSpec.from_config({"priority": rl.priority, "resources": [
        {"name": r.name, "count": r.count, "global": getattr(r, "global")} for r in rl.resources]})
