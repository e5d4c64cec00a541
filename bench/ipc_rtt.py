"""Round trip of a 64-byte message between two processes, alternating, medians over rounds:

- zeromq ipc: libzmq ROUTER/DEALER on both sides (the supervisor's link before it spoke ZMTP itself);
- inferd link, libzmq worker: the supervisor's Channel (ZMTP on a uvloop event loop) and a libzmq DEALER
  (the worker's main socket until 2026-11-26);
- inferd link: the supervisor's Channel and the worker's own ZMTP DEALER (worker/zmtp_socket.py), as now;
- unix seqpacket: a plain socket pair, both processes left to the scheduler;
- unix, same CPU / other CPU: the same pair pinned to one CPU, or to two different CPUs.

    .venv/bin/python bench/ipc_rtt.py [--rounds 5] [--n 3000]

Why: at concurrency 1 a request's latency is a chain of thread wake-ups. A libzmq message crosses the
sender's I/O thread and the receiver's I/O thread before the receiving thread wakes; a Unix socket wakes the
receiver directly. The pinned pair shows what waking a thread on another (idle) CPU costs on this virtual
machine compared with a switch on the same CPU: the floor under "overhead per request at c=1" in
bench/frameworks.py.
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


def channel_rtt(n: int, native_worker: bool = True) -> float:
    """A worker's DEALER (its own ZMTP socket, or libzmq's) <-> the supervisor's Channel on uvloop."""
    import asyncio
    import tempfile

    import uvloop
    from inferd.supervisor.instances.channel import Channel

    run_dir = tempfile.mkdtemp(prefix="rtt-")

    async def serve() -> float:
        channel = Channel(run_dir)
        channel.open()
        pid = os.fork()
        if pid == 0:
            if native_worker:
                from inferd.worker.zmtp_socket import DealerSocket

                d = DealerSocket(channel.endpoint, b"w", 1 << 20)
                d.send_multipart([b"hello"])
                while bytes((msg := d.recv_multipart() or [b""])[0]) != b"quit":
                    d.send_multipart(msg)
                os._exit(0)
            ctx = zmq.Context()
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, b"w")
            s.connect(channel.endpoint)
            s.send(b"hello")
            while (msg := s.recv()) != b"quit":
                s.send(msg)
            os._exit(0)
        loop = asyncio.get_running_loop()
        state = {"left": n + 100, "t": 0.0}
        done = loop.create_future()

        def on_message(frames: list) -> None:
            if state["left"] == n:
                state["t"] = time.perf_counter()
            if state["left"] == 0:
                done.set_result(time.perf_counter() - state["t"])
                return
            state["left"] -= 1
            channel.send("w", [PAYLOAD])

        channel.register("w", on_message, lambda frames: None)
        dt = await done
        channel.send("w", [b"quit"])
        await loop.run_in_executor(None, os.waitpid, pid, 0)
        channel.close()
        os.rmdir(run_dir)
        return dt / n

    return uvloop.run(serve())


def unix_rtt(n: int, cpus: tuple[int, int] | None = None) -> float:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        if cpus:
            os.sched_setaffinity(0, {cpus[1]})
        a.close()
        while (msg := b.recv(4096)) != b"quit":
            b.send(msg)
        os._exit(0)
    b.close()
    saved = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
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
    os.sched_setaffinity(0, saved)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    kinds = {
        "zeromq ipc": zmq_rtt,
        "inferd link, libzmq worker": lambda n: channel_rtt(n, native_worker=False),
        "inferd link": channel_rtt,
        "unix seqpacket": unix_rtt,
        "unix, same CPU": lambda n: unix_rtt(n, (cpus[0], cpus[0])),
    }
    if len(cpus) > 1:
        kinds["unix, other CPU"] = lambda n: unix_rtt(n, (cpus[0], cpus[1]))
    got: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for name, fn in kinds.items():
            got[name].append(fn(args.n) * 1e6)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} us" for k, v in got.items()), flush=True)
    print("median round trip: " + ", ".join(f"{k} {statistics.median(v):.1f} us" for k, v in got.items()))


if __name__ == "__main__":
    main()
