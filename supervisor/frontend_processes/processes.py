"""The core's frontend processes: N children serving HTTP and gRPC, restarted when one dies.

`FrontendProcesses.start()` opens the link socket (in the run dir), reserves the HTTP and gRPC ports (a
bound, never listening SO_REUSEPORT socket each: port 0 becomes one free port all frontends share, and a
port in use is an error at start), and starts the children. A child that exits while the server runs is
started again after a capped exponential backoff (its clients saw their connections close: errors, not
hangs; the sibling frontends keep serving); one that stops answering is killed first (watchdog.py).
Children die with the supervisor (PR_SET_PDEATHSIG, set by the child) and are stopped (SIGTERM, then
SIGKILL) by `stop()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

from ..config import ServerConfig
from ..core.dataplane_impl import ServerDataPlane
from ..instances import worker as worker_process
from ..metrics.endpoint import MetricsEndpoint
from . import core_link, watchdog
from .frontend_main import max_frame
from .publisher import Publisher

log = logging.getLogger("inferd.scaleout")

RESTART_BASE_S = 0.2
RESTART_CAP_S = 5.0
HEALTHY_AFTER_S = 10.0
SERVING_TIMEOUT_S = 60.0  # a child that ran this long restarts without backoff


def _reserve(what: str, address: str, port: int, shared: bool) -> socket.socket:
    try:
        return _bind(address, port, shared)
    except OSError as exc:  # worded as the servers word it (grpc_api/native_server.py)
        raise OSError(exc.errno, f"{what} cannot bind {address}:{port}: {exc}") from exc


def _bind(address: str, port: int, shared: bool) -> socket.socket:
    """A bound, never listening SO_REUSEPORT socket holding `port` (0: a free one) for the frontends. Unless
    `shared` (--reuse-*-port: other servers may share it), the port is first bound exclusively, so a port
    another server holds is an error here, as with one process, not a silent share."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    if not shared:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
            port = probe.getsockname()[1]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


class FrontendProcesses:
    def __init__(self, config: ServerConfig, dataplane: ServerDataPlane, count: int) -> None:
        self.config = config
        self.count = count
        self.dp = dataplane
        self.publisher = Publisher(dataplane)
        self.link_path = os.path.join(config.run_dir, "frontends.sock")
        self._reserved: list[socket.socket] = []
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        self.restarts = 0
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port

    async def start(self) -> None:
        cfg = self.config
        if cfg.allow_http:
            sock = _reserve("HTTP server", cfg.http_address, cfg.http_port, cfg.reuse_http_port)
            self._reserved.append(sock)
            self.http_port = sock.getsockname()[1]
        if cfg.allow_grpc:
            sock = _reserve("gRPC server", cfg.grpc_address, cfg.grpc_port, cfg.reuse_grpc_port)
            self._reserved.append(sock)
            self.grpc_port = sock.getsockname()[1]
        if os.path.exists(self.link_path):
            os.unlink(self.link_path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(core_link.server(self.dp, self.publisher, max_frame(cfg)),
                                                     self.link_path)
        os.chmod(self.link_path, 0o600)
        self.dp.manager.watch(self.publisher.changed)
        # the direct path (direct_core.py): statistics pulled from the frontends before they are read, and
        # a worker stopped only once the frontends have let go of it
        self.dp.stats_pull = self.publisher.pull_stats
        self.dp.direct_inflight = self.publisher.direct_inflight
        renderer = getattr(self.dp.metrics_renderer, "__self__", None)  # (a bound MetricsEndpoint.render)
        if isinstance(renderer, MetricsEndpoint):
            renderer.direct_pending = self.publisher.direct_pending
            renderer.direct_inflight = self.publisher.direct_inflight
        worker_process.BEFORE_STOP = self.publisher.detach
        self._tasks = [asyncio.ensure_future(self._keep(i)) for i in range(self.count)]
        beat = cfg.worker  # the workers' heartbeat settings pace the frontends' too
        self._tasks.append(asyncio.ensure_future(watchdog.watch(
            self.publisher, beat.heartbeat_interval_s, beat.heartbeat_interval_s * beat.heartbeat_misses)))
        log.info("Started %d frontend processes: HTTP :%d, gRPC :%d", self.count, self.http_port,
                 self.grpc_port)

    def _argv(self) -> list[str]:
        cfg = self.config
        args = list(cfg.argv) + ["--run-dir", cfg.run_dir, "--http-port", str(self.http_port),
                                 "--grpc-port", str(self.grpc_port)]
        return [sys.executable, "-m", "inferd.supervisor.frontend_processes.frontend_main", "--link", self.link_path,
                "--parent", str(os.getpid()), "--", *args]

    async def _keep(self, index: int) -> None:
        """Run frontend `index`, starting it again whenever it exits, until stop()."""
        delay = RESTART_BASE_S
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            try:
                proc = await asyncio.create_subprocess_exec(*self._argv(), stdin=asyncio.subprocess.DEVNULL)
            except OSError as exc:
                log.error("cannot start frontend process %d: %s", index, exc)
            else:
                self._children[index] = proc
                code = await proc.wait()
                self._children.pop(index, None)
                if self._stopping:
                    return
                log.error("frontend process %d (pid %d) exited with %s; restarting it", index, proc.pid, code)
                self.restarts += 1
            if loop.time() - started > HEALTHY_AFTER_S:
                delay = RESTART_BASE_S
            await asyncio.sleep(delay)  # backoff between restarts (a timer, not a poll)
            delay = min(RESTART_CAP_S, delay * 2)

    async def serving(self) -> None:
        """Return once every frontend process listens (or log after SERVING_TIMEOUT_S and go on)."""
        if not await self.publisher.serving(self.count, SERVING_TIMEOUT_S):
            log.warning("not all %d frontend processes listen after %.0fs", self.count, SERVING_TIMEOUT_S)

    def changed(self) -> None:
        self.publisher.changed()

    async def stop(self, grace: float | None = None) -> None:
        self._stopping = True
        if self.publisher.detach == worker_process.BEFORE_STOP:
            worker_process.BEFORE_STOP = None
        self.dp.stats_pull = None
        self.dp.direct_inflight = None
        renderer = getattr(self.dp.metrics_renderer, "__self__", None)
        if isinstance(renderer, MetricsEndpoint):
            renderer.direct_pending = renderer.direct_inflight = None
        procs = list(self._children.values())
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        wait_s = self.config.exit_timeout_secs if grace is None else grace
        if procs:
            done, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=wait_s + 1)
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for session in list(self.publisher.sessions):
            session.link.close()
        for sock in self._reserved:
            sock.close()
        self._reserved.clear()
        try:
            os.unlink(self.link_path)
        except OSError:
            pass
