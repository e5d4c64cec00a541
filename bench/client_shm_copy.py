"""Cost of copying a tensor out of / into a client's system shared-memory region: the old mmap path
(map the object once at registration, slice-copy per request; a shrunk object is a SIGBUS) against the
pread/pwrite path ClientShm uses now (the fd kept open; a shrunk object is a short count, never a fault).

Usage: .venv/bin/python bench/client_shm_copy.py [--rounds N]
Prints one markdown row per size and direction: median and p90 µs per copy, and the ratio.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
import uuid

from inferd.supervisor.memory.client_shm import ClientShm

SIZES = {"4 KiB": 4 << 10, "1 MiB": 1 << 20, "64 MiB": 64 << 20}


def timed(fn, rounds: int) -> tuple[float, float]:
    fn()  # warm: page cache, first-touch faults of the mapping
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9) - 1]


def one_size(label: str, size: int, rounds: int) -> None:
    key = "bench_cshm_" + uuid.uuid4().hex[:8]
    fd = os.open("/dev/shm/" + key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        payload = memoryview(os.urandom(min(size, 1 << 20)) * max(1, size >> 20))
        os.pwrite(fd, payload, 0)
        mapping = mmap.mmap(fd, size)
        cs = ClientShm()
        cs.register("system", "r", key=key, byte_size=size)

        def old_read() -> bytes:
            return bytes(memoryview(mapping)[0:size])

        def old_write() -> None:
            memoryview(mapping)[0:size] = payload

        rows = [("read (input)", old_read, lambda: cs.read("r", 0, size)),
                ("write (output)", old_write, lambda: cs.write("r", 0, payload))]
        for direction, old, new in rows:
            o50, o90 = timed(old, rounds)
            n50, n90 = timed(new, rounds)
            print(f"| {label} | {direction} | {o50:.1f} / {o90:.1f} | {n50:.1f} / {n90:.1f} | {n50 / o50:.2f}× |")
        cs.unregister("system")
        mapping.close()
    finally:
        os.close(fd)
        os.unlink("/dev/shm/" + key)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=0, help="copies per point (default: by size)")
    args = ap.parse_args()
    print("| size | direction | mmap (old) µs p50 / p90 | pread/pwrite (new) µs p50 / p90 | new / old |")
    print("|---|---|---|---|---|")
    for label, size in SIZES.items():
        one_size(label, size, args.rounds or max(20, min(2000, (256 << 20) // size)))


if __name__ == "__main__":
    main()
