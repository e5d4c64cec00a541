"""Composition root: builds the components in dependency order, starts them, and stops them in reverse.

Signal handlers only set an event; shutdown is: readiness false and new requests refused, in-flight
requests drained within --exit-timeout-secs, frontends closed, workers stopped, shared memory freed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from typing import Any

from inferd.worker.wire.errors import InferdError

from . import gpus as gpus_mod
from . import sdnotify
from .bls_api.service import BlsService
from .config import ServerConfig
from .core import loader
from .core.busy_poll import BusyPoll
from .core.dataplane_impl import ServerDataPlane
from .core.load_settings import LoaderSettings
from .core.models import ModelManager
from .core.poller import RepositoryPoller, scan_fingerprints
from .core.runtime import Runtime
from .http_api import orca
from .metrics import model_statistics as stats_mod
from .metrics.custom import CustomMetrics
from .metrics.endpoint import MetricsEndpoint
from .metrics.gpu import GpuMetrics
from .repository.agents import PollFailed
from .response_cache import ResponseCache
from .tracing.tracer import Tracer

log = logging.getLogger("inferd")


class App:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.stop_event: asyncio.Event | None = None
        self.exit_code = 0
        self._servers: list[Any] = []
        self._frontend_processes: Any = None  # FrontendProcesses (frontend_processes/) with --frontend-processes > 1

    async def run(self) -> int:
        self.stop_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        discovery = await asyncio.to_thread(
            gpus_mod.discover, gpus_mod.nvml_factory(self.config.test_only_fake_gpus),
            self.config.cuda_visible_devices, self.config.cuda_device_order)
        gpu_metrics = self._gpu_metrics(discovery)
        runtime = await Runtime.start(self.config)
        frontends = self._frontend_count(self.config.allow_client_shm and bool(discovery.cuda_ids)
                                         and runtime.client_shm.cuda_available)
        if self.config.host_fd >= 0:  # models hosted by the Python API's process: its exit stops the server
            from .instances.external import HostLink

            runtime.host = HostLink(self.config.host_fd, self._host_lost)
            await runtime.host.start()
        registry = stats_mod.StatsRegistry(self.config.metrics_latency)
        cache_bytes = self.config.response_cache_bytes
        response_cache = ResponseCache(cache_bytes) if cache_bytes is not None else None
        custom_metrics = CustomMetrics()  # pb_utils.MetricFamily: the workers report on their metrics sockets
        custom_metrics.attach(runtime.channel)
        manager = ModelManager(LoaderSettings.from_config(self.config, runtime, discovery.cuda_ids), registry,
                               response_cache=response_cache is not None)
        busy_poll = BusyPoll(self.config.busy_poll_us) if self.config.busy_poll_us else None
        dataplane = ServerDataPlane(
            manager,
            server_id=self.config.server_id,
            control_mode=self.config.model_control_mode,
            strict_readiness=self.config.strict_readiness,
            stats_registry=registry,
            metrics_renderer=MetricsEndpoint(registry, manager, runtime, cpu_metrics=self.config.allow_cpu_metrics,
                                             pinned_pool_bytes=self.config.pinned_memory_pool_bytes,
                                             cache=response_cache, gpu=gpu_metrics, custom=custom_metrics).render,
            shm=runtime.client_shm if self.config.allow_client_shm else None,
            response_cache=response_cache,
            busy_poll=busy_poll,
            # the cuda_shared_memory extension: client shm allowed, a GPU discovered, a CUDA binding installed
            # (not with frontend processes: they read clients' regions themselves, host memory only)
            cuda_shared_memory_supported=(self.config.allow_client_shm and bool(discovery.cuda_ids)
                                          and runtime.client_shm.cuda_available and frontends == 1),
            log_settings={"log_file": self.config.log_file, "log_info": self.config.log_info,
                          "log_warning": self.config.log_warning, "log_error": self.config.log_error,
                          "log_verbose_level": self.config.log_verbose, "log_format": self.config.log_format},
            tracer=Tracer(self.config.trace),
            load_reporter=functools.partial(orca.load_report, custom_metrics),  # endpoint-load-metrics
        )
        BlsService(dataplane, runtime.channel, runtime.pool)  # Python models calling models
        poller: RepositoryPoller | None = None
        try:
            await self._start_frontends(dataplane, frontends)
            seen = await self._poll_snapshot(manager) if self.config.model_control_mode == "poll" else {}
            ok = await self._initial_load(manager)
            if not ok and self.config.exit_on_error:
                log.error("failed to load all models")
                self.exit_code = 1
                self.stop_event.set()
            dataplane.started = True
            self._state_changed()
            if self._frontend_processes is not None:  # "ready" (and READY=1) once the ports answer
                await self._frontend_processes.serving()
            if ok or not self.config.exit_on_error:
                log.info("inferd ready")
                sdnotify.notify(self.config.notify_socket, "READY=1",
                                "STATUS=serving %d model version(s)" % len(manager.loaded_versions()))
                if runtime.host is not None:  # the Python API waits for this instead of polling
                    runtime.host.send({"op": "ready"})
            if self.config.model_control_mode == "poll" and not self.stop_event.is_set():
                poller = RepositoryPoller(manager, manager.settings.repos,
                                          self.config.repository_poll_secs, seen)
                poller.start()
            await self.stop_event.wait()
            if poller is not None:
                await poller.stop()
            log.info("shutting down: draining in-flight requests (up to %.0fs)", self.config.exit_timeout_secs)
            sdnotify.notify(self.config.notify_socket, "STOPPING=1", "STATUS=draining in-flight requests")
            dataplane.draining = True
            self._state_changed()
            await manager.shutdown(self.config.exit_timeout_secs)
        finally:
            if poller is not None:
                await poller.stop()
            await self._stop_frontends()
            if busy_poll is not None:
                busy_poll.close()
            manager.settings.repos.close()
            dataplane.tracer.close()  # the trace file completed, the last spans exported
            await runtime.close()
            # NVML is shut down only once no poll is inside it (a wedged driver call keeps its daemon thread)
            if gpu_metrics is None or await asyncio.to_thread(gpu_metrics.stop):
                discovery.close()
        log.info("inferd stopped")
        return self.exit_code

    def _host_lost(self) -> None:
        if self.stop_event is not None and not self.stop_event.is_set():
            log.info("the host process exited: shutting down")
            self.stop_event.set()

    def _gpu_metrics(self, discovery: gpus_mod.Discovery) -> GpuMetrics | None:
        """The NVML poller behind the nv_gpu_* metrics, started; None without. Logs what discovery found,
        and, on a host without GPUs, that no GPU metrics are exported, in one line."""
        cfg = self.config
        for line in discovery.warnings:
            log.warning("%s", line)
        wanted = cfg.allow_metrics and cfg.allow_gpu_metrics
        if discovery.nvml is None or not discovery.gpus:
            log.info("%s%s", discovery.note, "; no GPU metrics are exported" if wanted else "")
            return None
        log.info("%s", discovery.note)
        if not wanted:
            return None
        poller = GpuMetrics(discovery.nvml, discovery.gpus, cfg.metrics_interval_ms / 1000.0)
        for gpu in poller.gpus:
            log.info("GPU metrics: collecting for GPU %d (%s) every %g ms", gpu.cuda_id, gpu.uuid,
                     cfg.metrics_interval_ms)
        poller.start()
        return poller

    async def _poll_snapshot(self, manager: ModelManager) -> dict[str, str]:
        """The models' fingerprints before the start-up load: the first poll reloads what changed since."""
        try:
            return await scan_fingerprints(manager.settings.repos)
        except InferdError as exc:
            log.error("reading the model repository failed: %s", exc.message)
            return {}

    async def _initial_load(self, manager: ModelManager) -> bool:
        cfg = self.config
        listed = True
        if manager.settings.repos.cloud:  # list the cloud repositories (a poll snapshot may just have)
            try:
                await manager.settings.repos.refresh_async()
            except InferdError as exc:
                log.error("reading the model repository failed: %s", exc.message)
                listed = cfg.model_control_mode == "explicit" and "*" not in cfg.load_models
        if cfg.model_control_mode == "explicit":
            names = list(loader.list_model_names(manager.settings)) if "*" in cfg.load_models else list(
                cfg.load_models)
        else:
            names = list(loader.list_model_names(manager.settings))
        limit = asyncio.Semaphore(4)

        async def load(name: str) -> bool:
            async with limit:
                try:
                    await manager.load_once(name)  # an ensemble may have loaded it already
                    return True
                except InferdError as exc:
                    if not isinstance(exc, PollFailed):  # the manager logged it as Triton does
                        log.error("failed to load '%s': %s", name, exc.message)
                    return False

        results = await asyncio.gather(*(load(n) for n in names))
        return listed and all(results)

    def _state_changed(self) -> None:
        """Readiness changed: frontend processes are told (one process reads the data plane directly)."""
        if self._frontend_processes is not None:
            self._frontend_processes.changed()

    def _frontend_count(self, cuda_shm: bool) -> int:
        """--frontend-processes, or its default; the default is 1 where the cuda_shared_memory extension
        works, which frontend processes cannot serve (they read clients' regions themselves)."""
        cfg = self.config
        if cfg.frontend_processes > 1 and cuda_shm and not cfg.frontend_processes_given:
            log.info("serving HTTP and gRPC in this process (the default on %d CPUs would be %d frontend processes): "
                     "CUDA shared memory needs it; --frontend-processes N sets N", len(os.sched_getaffinity(0)),
                     cfg.frontend_processes)
            return 1
        if cfg.frontend_processes > 1 and cuda_shm:
            log.warning("--frontend-processes %d: CUDA shared memory is not served (frontend processes read "
                        "clients' host regions only)", cfg.frontend_processes)
        return cfg.frontend_processes

    async def _start_frontends(self, dataplane: ServerDataPlane, frontends: int) -> None:
        cfg = self.config
        if frontends > 1 and (cfg.allow_http or cfg.allow_grpc):
            # HTTP and gRPC in N processes of their own (frontend_processes/); the metrics port stays here
            from .frontend_processes.processes import FrontendProcesses

            self._frontend_processes = FrontendProcesses(cfg, dataplane, frontends)
            await self._frontend_processes.start()
            self._servers.append(self._frontend_processes)
        else:
            if cfg.allow_http:
                from .http_api import frontend as http_frontend

                self._servers.append(await http_frontend.start(dataplane, cfg))
            if cfg.allow_grpc:
                from .grpc_api import frontend as grpc_frontend

                self._servers.append(await grpc_frontend.start(dataplane, cfg))
        if cfg.openai.port:  # the OpenAI API, in this process whatever the frontend count (openai_api/)
            from .openai_api import frontend as openai_frontend

            self._servers.append(await openai_frontend.start(dataplane, cfg))
        if cfg.allow_metrics:
            from .http_api import frontend as http_frontend

            self._servers.append(await http_frontend.start_metrics(dataplane, cfg))

    async def _stop_frontends(self) -> None:
        for server in reversed(self._servers):
            try:
                await server.stop()
            except Exception:  # a frontend that fails to stop must not keep the others running
                log.exception("error while stopping a frontend")
        self._servers.clear()
