"""`inferd` entry point: parse the command line, run the server on uvloop, exit with its status."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import sys

from . import logs
from .flags import parse_args


def _tune_malloc() -> None:
    """Keep big tensor buffers out of the brk heap and stop glibc trimming it after every large free:
    otherwise each multi-MiB request pays for page faults and brk calls (measured ~4 ms per 4 MiB)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    libc.mallopt(m_trim_threshold, 256 * 1024 * 1024)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    # Workers are spawned while gRPC threads run; its fork handlers only add noise (we exec at once).
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    _tune_malloc()
    try:
        logs.configure(config.log_verbose, config.log_format, config.log_file, config.log_info,
                       config.log_warning, config.log_error)
    except OSError as exc:
        print(f"error: --log-file {config.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for line in config.inert_flags:
        logging.getLogger("inferd").info("%s", line)
    from .app import App

    # Everything imported so far lives as long as the process: keep it out of the collector's full
    # passes, which otherwise stall the event loop for milliseconds (p99 18 -> 12 ms, batching bench).
    gc.collect()
    gc.freeze()
    # A batch in flight holds a few thousand tracked objects (requests, tensors, futures), so with the
    # default 700 the young-generation collector ran about once per batch and promoted them all into
    # costly older-generation passes (~12 us CPU per request in the batching benchmark); 10000 lets
    # requests die by reference counting first. Cyclic garbage is still collected, only less often.
    gc.set_threshold(10_000, 10, 10)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return asyncio.run(App(config).run())
    return uvloop.run(App(config).run())


if __name__ == "__main__":
    sys.exit(main())
