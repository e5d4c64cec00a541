"""`inferd` entry point: parse the command line, run the server on uvloop, exit with its status."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from .config import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    # Workers are spawned while gRPC threads run; its fork handlers only add noise (we exec at once).
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    logging.basicConfig(
        level=logging.DEBUG if config.log_verbose > 0 else logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname).1s %(name)s] %(message)s",
        datefmt="%m%d %H:%M:%S",
        stream=sys.stderr,
    )
    from .app import App

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return asyncio.run(App(config).run())
    return uvloop.run(App(config).run())


if __name__ == "__main__":
    sys.exit(main())
