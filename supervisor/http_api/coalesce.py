"""The second and later small HTTP responses of an event-loop pass leave together at its end.

A batch's results answer many connections in one pass. Each write to a client whose thread sleeps
on another, idle CPU wakes that CPU, and on a virtual machine the writer pays for the wake-up inside
the send call (more than half of its cost here). Written back to back at the end of the pass, the
responses find the client still awake reading the previous one. The first answer of a pass leaves at
once: a lone answer (one client, one request) waits for nothing.

A flush scheduled with call_soon runs on the loop's next pass, after the I/O callbacks of that pass;
so a connection that reads a request first writes out what is held (`flush`, when `held`), and no
request is parsed while answers wait.
"""

from __future__ import annotations

import asyncio


class Coalescer:
    """Writes the first small answer of a pass at once and holds the following ones, per transport,
    until the pass is over. Any other write to, or close of, a transport must `release` it first, so
    its bytes keep their order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.waiting: dict[asyncio.Transport, list[bytes]] = {}  # answers held, per transport
        self._in_pass = False  # an answer has been written in this pass: hold the next ones

    @property
    def held(self) -> bool:
        return bool(self.waiting)

    def write(self, transport: asyncio.Transport, data: bytes) -> None:
        if not self._in_pass:
            self._in_pass = True
            self._loop.call_soon(self.flush)
            transport.write(data)
            return
        held = self.waiting
        parts = held.get(transport)
        if parts is None:
            held[transport] = [data]
        else:
            parts.append(data)

    def release(self, transport: asyncio.Transport) -> None:
        """Write what is held for `transport` now."""
        parts = self.waiting.pop(transport, None)
        if parts and not transport.is_closing():
            transport.write(b"".join(parts))

    def drop(self, transport: asyncio.Transport) -> None:
        """Forget what is held for `transport` (aborted or lost)."""
        self.waiting.pop(transport, None)

    def flush(self) -> None:
        self._in_pass = False
        held, self.waiting = self.waiting, {}
        for transport, parts in held.items():
            if not transport.is_closing():
                transport.write(parts[0] if len(parts) == 1 else b"".join(parts))
