"""systemd Type=notify (issue 18 item 9): a real server started with $NOTIFY_SOCKET sends READY=1 on a
real unix datagram socket once it is ready, and STOPPING=1 when SIGTERM starts the drain."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from inferd.supervisor import sdnotify

pytestmark = pytest.mark.inferd_only


def receive(sock: socket.socket, timeout: float = 30.0) -> dict[str, str]:
    sock.settimeout(timeout)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify.sock")
        sock.bind(name)
    else:
        name = "@inferd-test-notify-%d" % os.getpid()
        sock.bind("\0" + name[1:])
    try:
        yield sock, name
    finally:
        sock.close()


def test_ready_then_stopping(server_factory, notify_socket, monkeypatch):
    sock, name = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    server = server_factory(["identity_fp32"])
    ready = receive(sock)
    assert ready.get("READY") == "1" and "serving 1 model" in ready.get("STATUS", ""), ready
    assert server.get("/v2/health/ready")[0] == 200  # READY=1 came when the server was ready
    server.proc.send_signal(signal.SIGTERM)
    stopping = receive(sock)
    assert stopping.get("STOPPING") == "1", stopping
    assert server.proc.wait(timeout=30) == 0


def test_no_socket_or_bad_socket_sends_nothing(tmp_path):
    assert not sdnotify.notify("", "READY=1")
    assert not sdnotify.notify("relative/path", "READY=1")
    assert not sdnotify.notify(str(tmp_path / "nobody-listens"), "READY=1")  # logged, never raised


def test_config_reads_notify_socket(tmp_path):
    from inferd.supervisor.flags import parse_args

    argv = ["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    assert parse_args(argv, {"NOTIFY_SOCKET": "/run/systemd/notify"}).notify_socket == "/run/systemd/notify"
    assert parse_args(argv, {}).notify_socket == ""
