"""systemd's readiness protocol (sd_notify) without libsystemd: one datagram on $NOTIFY_SOCKET.

With `Type=notify` systemd waits for READY=1 before it counts the service as started, and STOPPING=1
tells it that shutdown has begun. The socket path comes from the config (the only reader of the
environment); "" means not started by systemd, and nothing is sent. A failure to send is logged,
never raised: notification must not take the server down.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("inferd.sdnotify")


def address(path: str) -> str | None:
    """The socket address of $NOTIFY_SOCKET: an absolute path, or "@name" for the abstract namespace."""
    if path.startswith("/"):
        return path
    if path.startswith("@") and len(path) > 1:
        return "\0" + path[1:]
    return None


def notify(path: str, *fields: str) -> bool:
    """Send "KEY=value" fields (e.g. "READY=1", "STATUS=...") as one datagram; True when sent."""
    if not path:
        return False
    addr = address(path)
    if addr is None:
        log.warning("NOTIFY_SOCKET %r is neither an absolute path nor an abstract name; not notifying", path)
        return False
    payload = "\n".join(fields).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(payload)
    except OSError as exc:
        log.warning("could not notify systemd (%s) at %s: %s", fields[0] if fields else "", path, exc)
        return False
    return True
