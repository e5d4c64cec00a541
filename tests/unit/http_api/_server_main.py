"""The HTTP frontend over the in-test FakeDataPlane in a process of its own, for tests that measure the
server's memory and CPU with psutil (test_limits.py).

Usage: python _server_main.py MAX_INPUT MAX_CONNECTIONS MAX_PIPELINED; prints "port <n>" once listening
and exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop
from fake_dataplane import FakeDataPlane
from inferd.supervisor.http_api import start_http_api


async def main() -> None:
    max_input, max_connections, max_pipelined = (int(a) for a in sys.argv[1:4])
    server = await start_http_api(FakeDataPlane(), "127.0.0.1", 0, max_input_size=max_input,
                                  max_connections=max_connections, max_pipelined=max_pipelined)
    print(f"port {server.port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.wait_closed(2.0)


if __name__ == "__main__":
    uvloop.run(main())
