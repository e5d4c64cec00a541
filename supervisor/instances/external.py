"""Instances whose worker is an external process that connects by itself (backend "external").

The Python API (`inferd.pytriton`) starts the server as its child and hosts the bound functions in
its own process. The two are linked by one inherited Unix stream socket (`--host-fd`) carrying JSON
lines (docs/worker-protocol.md, "External workers"):

    supervisor -> host   {"op": "start", "identity", "instance_name", "model", "bootstrap": {...}}
                         {"op": "kill", "identity"}
                         {"op": "ready"}  (frontends up, start-up loads done)
    host -> supervisor   {"op": "exited", "identity", "code"}

Everything else is the ordinary worker protocol: the host connects a worker (Hello, LoadModel,
Execute...) for each `start`, so queues, batching, statistics and readiness stay the supervisor's.
`ExternalLauncher.spawn` stands in for `Launcher.spawn` and returns an `ExternalProcess` that looks like
the asyncio process `WorkerProcess` expects (pid, returncode, wait, kill). EOF on the link means the host
process is gone: every external instance exits at once and `on_lost` is called (the server shuts down).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from .launcher import Bootstrap

log = logging.getLogger("inferd.instances.external")

BACKEND = "external"
HOST_LOST_CODE = -9  # an instance of a host that vanished reads as killed
_MAX_LINE = 64 * 1024


class ExternalProcess:
    """The host's worker for one instance, as far as the supervisor can see it."""

    external = True
    stdin = None

    def __init__(self, link: HostLink, identity: str, pid: int) -> None:
        self._link = link
        self.identity = identity
        self.pid = pid
        self.returncode: int | None = None
        self._done = asyncio.Event()

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._done.set()

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """As SIGKILL: the instance is gone now (requests fail, a replacement may start) even if the host
        is frozen; the host drops it (its sockets close) when it reads the line, and its late `exited`
        is ignored."""
        if self.returncode is None:
            self._link.send({"op": "kill", "identity": self.identity})
            self._link.forget(self.identity)
            self.exited(HOST_LOST_CODE)


class HostLink:
    """The supervisor's end of the `--host-fd` socket."""

    def __init__(self, fd: int, on_lost: Callable[[], None]) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._on_lost = on_lost
        self._procs: dict[str, ExternalProcess] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self.lost = False
        try:
            self.host_pid = int(struct.unpack("3i", self._sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0])
        except OSError:
            self.host_pid = 0

    async def start(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock, limit=_MAX_LINE)
        self._task = asyncio.get_running_loop().create_task(self._read(reader), name="host-link")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                    proc = self._procs.pop(str(msg["identity"])) if msg.get("op") == "exited" else None
                    if proc is not None:
                        proc.exited(int(msg.get("code", 0)))
                except (ValueError, KeyError, TypeError, AttributeError):
                    log.warning("host link: ignoring a malformed line")
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            log.warning("host link broken: %s", exc)
        self._gone()

    def _gone(self) -> None:
        if self.lost:
            return
        self.lost = True
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            proc.exited(HOST_LOST_CODE)
        log.info("the process hosting the external models (pid %s) is gone", self.host_pid or "?")
        self._on_lost()

    def send(self, msg: dict[str, Any]) -> None:
        if self.lost or self._writer is None:
            return
        try:
            self._writer.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        except (OSError, RuntimeError):
            self._gone()

    def forget(self, identity: str) -> None:
        self._procs.pop(identity, None)

    def spawn(self, bootstrap: Bootstrap, model: str) -> ExternalProcess:
        if self.lost:
            raise InferdError(ErrorCode.UNAVAILABLE, "the process hosting the external models is gone")
        proc = ExternalProcess(self, bootstrap.identity, self.host_pid)
        self._procs[bootstrap.identity] = proc
        self.send({"op": "start", "identity": bootstrap.identity, "instance_name": bootstrap.instance_name,
                   "model": model, "bootstrap": json.loads(bootstrap.line())})
        return proc

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: S110 - closing anyway
                pass
        for proc in list(self._procs.values()):
            proc.exited(HOST_LOST_CODE)
        self._procs.clear()


class ExternalLauncher:
    """`Launcher.spawn` for instances of backend "external": asks the host instead of forking."""

    def __init__(self, link: HostLink | None, model: str) -> None:
        self._link = link
        self._model = model

    async def spawn(self, bootstrap: Bootstrap, **_: Any) -> ExternalProcess:
        if self._link is None:
            raise InferdError(ErrorCode.UNAVAILABLE, f"model '{self._model}' has backend '{BACKEND}' (a bound "
                              "Python function), but no host process is connected (--host-fd)")
        return self._link.spawn(bootstrap, self._model)
