"""Hosting bound functions in this process: one worker (a thread) per model instance.

The server, our child, asks for workers over the `--host-fd` socket (JSON lines; see
docs/worker-protocol.md, "External workers"). For each `start` a thread connects to the server as that
worker (Hello, then the ordinary message loop of worker/message_loop.py with a `FunctionBackend`) and says
`exited` when it ends; `kill` closes its sockets and is answered `exited` at once (a function stuck in
user code keeps its thread until it returns). EOF on the link means the server is gone.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, Optional

import zmq
from inferd.worker.channel import Channel, HeartbeatThread
from inferd.worker.message_loop import Runtime
from inferd.worker.wire.messages import WIRE_VERSION, Hello, ProtocolError

from .backend import FunctionBackend
from .model_spec import BoundModel


def _log(message: str) -> None:
    try:
        sys.stderr.write("inferd.pytriton[%d]: %s\n" % (os.getpid(), message))
    except (OSError, ValueError):
        pass


class _Instance:
    def __init__(self, host: Host, identity: str, instance_name: str, model: BoundModel, func: Any,
                 boot: dict[str, Any]) -> None:
        self.host = host
        self.identity = identity
        self.instance_name = instance_name
        self.model = model
        self.func = func
        self.boot = boot
        self.channel: Optional[Channel] = None
        self.killed = False
        self.thread = threading.Thread(target=self.run, name="inferd-instance-%s" % instance_name, daemon=True)

    def run(self) -> None:
        code = 0
        heartbeat = None
        runtime: Optional[Runtime] = None
        try:
            endpoint = str(self.boot["endpoint"])
            self.channel = Channel(endpoint, self.identity)
            if self.killed:
                raise ProtocolError("killed")
            # the host link tells us when the server is gone: no heartbeat timeout in the user's process
            heartbeat = HeartbeatThread(self.host.context, endpoint, self.identity,
                                        float(self.boot.get("heartbeat_interval_s") or 1.0), 0.0, lambda why: None)
            heartbeat.start()
            self.channel.send(Hello(wire_version=WIRE_VERSION, pid=os.getpid(), instance_name=self.instance_name,
                                    python_version="%d.%d.%d" % sys.version_info[:3],
                                    numpy_version=_numpy_version(), zmq_version=zmq.pyzmq_version()))
            runtime = Runtime(self.channel, int(self.boot.get("log_verbose") or 0), _log,
                              backend_factory=lambda name: FunctionBackend(self.model, self.func), polls=False)
            runtime.run()
        except ProtocolError as exc:
            if not self.killed and not self.host.closed:
                _log("instance %s: %s" % (self.instance_name, exc))
            code = 3
        except Exception as exc:  # a bug of ours: report it as the worker's exit
            _log("instance %s failed: %s: %s" % (self.instance_name, type(exc).__name__, exc))
            code = 5
        finally:
            if runtime is not None:
                runtime.release()  # this process lives on: its regions and mappings must not
            if heartbeat is not None:
                heartbeat.stop()
                heartbeat.join(timeout=1.0)
            if self.channel is not None:
                self.channel.close()
            self.host.exited(self, code)

    def kill(self) -> None:
        """Wake the thread out of its socket read: the runtime sees the link closed and ends."""
        self.killed = True
        channel = self.channel
        if channel is None:
            return
        try:
            dup = socket.socket(fileno=os.dup(channel.fileno()))
        except OSError:
            return
        try:
            dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        dup.close()


def _numpy_version() -> str:
    import numpy

    return str(numpy.__version__)


class Host:
    """This process's end of the `--host-fd` link."""

    def __init__(self, sock: socket.socket, models: dict[str, BoundModel],
                 on_server_gone: Callable[[], None]) -> None:
        self._sock = sock
        self._models = models
        self._on_server_gone = on_server_gone
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # instance threads report exits concurrently
        self._instances: dict[str, _Instance] = {}
        self.context = zmq.Context()
        self.closed = False
        self.ready = threading.Event()  # the server said it serves (or it is gone: check `closed`)
        self._reader = threading.Thread(target=self._read, name="inferd-host-link", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    self._handle(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    _log("ignoring a malformed line from the server: %s" % exc)
        self._gone()

    def _handle(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "ready":
            self.ready.set()
            return
        identity = str(msg["identity"])
        if op == "start":
            model = self._models.get(str(msg["model"]))
            name = str(msg["instance_name"])
            if model is None:
                self._send({"op": "exited", "identity": identity, "code": 2})
                return
            index = int(name.rsplit("_", 1)[-1]) if name.rsplit("_", 1)[-1].isdigit() else 0
            func = model.callables[index % len(model.callables)]
            inst = _Instance(self, identity, name, model, func, dict(msg["bootstrap"]))
            with self._lock:
                self._instances[identity] = inst
            inst.thread.start()
        elif op == "kill":
            with self._lock:
                found = self._instances.get(identity)
            if found is not None:  # as SIGKILL would: the instance is gone now, even if its function is stuck
                found.kill()
                self.exited(found, -9)

    def exited(self, inst: _Instance, code: int) -> None:
        """Report an instance's end once (a killed one is reported at once; its thread ends later)."""
        with self._lock:
            if self._instances.pop(inst.identity, None) is None:
                return
        self._send({"op": "exited", "identity": inst.identity, "code": code})

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            with self._send_lock:
                self._sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        except OSError:
            pass

    def _gone(self) -> None:
        self.closed = True
        self.ready.set()
        with self._lock:
            instances = list(self._instances.values())
        for inst in instances:
            inst.kill()
        self._on_server_gone()

    def close(self) -> None:
        """After the server exited: end what is left (threads stuck in user code stay, as daemons)."""
        self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(timeout=5.0)
        self._sock.close()
