"""A frontend process: `python -m inferd.supervisor.frontend_processes.frontend_main --link PATH --parent PID -- ARGS`.

ARGS is the server's own command line (the same frozen ServerConfig is parsed from it). The process dies
with the supervisor (PR_SET_PDEATHSIG), connects to the core's link socket, waits for the first snapshot,
then serves the HTTP and gRPC ports with SO_REUSEPORT beside its siblings (the metrics port stays on the
core). It exits when the link is lost (the core restarts it) or on SIGTERM (after a grace period for
requests in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys
from dataclasses import replace
from typing import Any

from .. import logs
from ..config import ServerConfig
from ..core.busy_poll import BusyPoll
from ..flags import parse_args
from ..memory.shm_pool import ShmPool
from .frames import Kind
from .remote_dataplane import RemoteDataPlane

log = logging.getLogger("inferd.scaleout")

PR_SET_PDEATHSIG = 1
FIRST_SNAPSHOT_TIMEOUT_S = 60.0
IDLE_REGION_S = 3600.0
LINK_SLACK_BYTES = 16 * 1024 * 1024  # a frame may carry a whole request body plus its header


def die_with_parent(parent: int) -> None:
    """SIGKILL when the supervisor exits (the kernel's parent-death signal), and exit now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def max_frame(config: ServerConfig) -> int:
    """The largest frame either end takes: a load request's files ride base64-encoded (4/3 of the body)."""
    body = max(int(config.http_max_input_size), int(config.grpc_max_message_size or 0))
    return 2 * body + LINK_SLACK_BYTES


async def serve(config: ServerConfig, link_path: str) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Ctrl-C reaches the whole process group: the supervisor drains, then stops the frontends itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # this process's regions: large inputs go to the workers by handle. Workers are not told when a frontend
    # unlinks one (they drop it from their LRU cache in time), and their mapping keeps its pages anyway, so
    # regions are kept for reuse for an hour rather than unlinked after the core pool's 30 s of idleness
    pool = ShmPool(idle_s=IDLE_REGION_S)
    dp = RemoteDataPlane(pool)
    servers: list[Any] = []
    try:
        if config.frontend_direct:
            dp.enable_direct(config.run_dir)
            if config.busy_poll_us:  # this process sends the Executes of direct models: it polls as the core does
                dp.busy_poll = BusyPoll(config.busy_poll_us)
        await dp.connect(link_path, max_frame(config))
        await asyncio.wait_for(dp.first_snapshot.wait(), FIRST_SNAPSHOT_TIMEOUT_S)
        if config.allow_http:
            from ..http_api import frontend as http_frontend

            servers.append(await http_frontend.start(dp, config))
        if config.allow_grpc:
            from ..grpc_api import frontend as grpc_frontend

            servers.append(await grpc_frontend.start(dp, config))
        assert dp.link is not None
        dp.link.send(Kind.SERVING, 0, b"")
        lost = asyncio.ensure_future(dp.lost.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({lost, stopped}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        stopped.cancel()
        grace = config.exit_timeout_secs if not dp.lost.is_set() else 0.0
        for server in reversed(servers):
            try:
                await server.stop(grace)
            except Exception:
                log.exception("error while stopping a frontend")
        return 0 if stop.is_set() else 1
    finally:
        if dp.busy_poll is not None:
            dp.busy_poll.close()
        if dp.link is not None:
            dp.link.close()
        if dp.outputs is not None:
            dp.outputs.close()
        if dp.direct is not None:
            await dp.direct.close()
            dp.direct.peers.close()
        pool.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd-frontend")
    p.add_argument("--link", required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    die_with_parent(args.parent)
    server_args = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    config = parse_args(server_args)
    # the ports are shared with the sibling frontends; nothing here owns the run dir
    config = replace(config, reuse_http_port=True, reuse_grpc_port=True, frontend_processes=1, owns_run_dir=False)
    logs.configure(config.log_verbose, config.log_format, config.log_file, config.log_info,
                   config.log_warning, config.log_error)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(config, args.link))
    return uvloop.run(serve(config, args.link))


if __name__ == "__main__":
    sys.exit(main())
