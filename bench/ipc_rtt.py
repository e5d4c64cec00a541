"""Round trip of a 64-byte message between two processes: ZeroMQ ipc (ROUTER/DEALER, as the supervisor and
its workers use) against a plain Unix SOCK_SEQPACKET pair, alternating, medians over rounds.

    .venv/bin/python bench/ipc_rtt.py [--rounds 5] [--n 3000]

Why: at concurrency 1 a request's latency is a chain of thread wake-ups. A ZeroMQ message crosses the
sender's I/O thread and the receiver's I/O thread before the receiving thread wakes; a Unix socket wakes the
receiver directly. This measures what that costs per round trip on this machine (the floor under
"overhead per request at c=1" in bench/frameworks.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import zmq

PAYLOAD = b"x" * 64


def zmq_rtt(n: int) -> float:
    path = f"ipc:///tmp/inferd-rtt-{os.getpid()}"
    pid = os.fork()
    if pid == 0:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.connect(path)
        s.send(b"hello")
        while (msg := s.recv()) != b"quit":
            s.send(msg)
        os._exit(0)
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(path)
    ident, _ = s.recv_multipart()
    for _ in range(100):  # warm-up
        s.send_multipart([ident, PAYLOAD])
        s.recv_multipart()
    t = time.perf_counter()
    for _ in range(n):
        s.send_multipart([ident, PAYLOAD])
        s.recv_multipart()
    dt = (time.perf_counter() - t) / n
    s.send_multipart([ident, b"quit"])
    os.waitpid(pid, 0)
    s.close(0)
    ctx.term()
    return dt


def unix_rtt(n: int) -> float:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        a.close()
        while (msg := b.recv(4096)) != b"quit":
            b.send(msg)
        os._exit(0)
    b.close()
    for _ in range(100):
        a.send(PAYLOAD)
        a.recv(4096)
    t = time.perf_counter()
    for _ in range(n):
        a.send(PAYLOAD)
        a.recv(4096)
    dt = (time.perf_counter() - t) / n
    a.send(b"quit")
    os.waitpid(pid, 0)
    a.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    z, u = [], []
    for r in range(args.rounds):
        z.append(zmq_rtt(args.n) * 1e6)
        u.append(unix_rtt(args.n) * 1e6)
        print(f"round {r + 1}: zeromq ipc {z[-1]:.1f} us, unix seqpacket {u[-1]:.1f} us", flush=True)
    print(f"median round trip: zeromq ipc {statistics.median(z):.1f} us, "
          f"unix seqpacket {statistics.median(u):.1f} us, "
          f"difference {statistics.median(z) - statistics.median(u):.1f} us")


if __name__ == "__main__":
    main()
