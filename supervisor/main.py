"""`inferd` entry point: parse the command line, run the server on uvloop, exit with its status."""

from __future__ import annotations

import asyncio
import logging
import sys

from .config import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if config.log_verbose > 0 else logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname).1s %(name)s] %(message)s",
        datefmt="%m%d %H:%M:%S",
        stream=sys.stderr,
    )
    from .app import App

    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        runner = asyncio.run
    return runner(App(config).run())


if __name__ == "__main__":
    sys.exit(main())
