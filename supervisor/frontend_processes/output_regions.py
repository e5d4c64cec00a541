"""A frontend process's mappings of workers' output regions (outputs sent by handle, frames.py).

`view(call, region, offset, nbytes)` maps the worker's region read-only (once: workers reuse their
regions; least recently used mappings beyond MAX_REGIONS are dropped, views still held stay valid) and
returns the output as a view whose collection is counted per call. When every output of a call has
been collected (the response was written), `release(call)` is called from the event loop, and the frontend
tells the core, which then lets the worker reuse the region.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable

import numpy as np
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

MAX_REGIONS = 64


class OutputRegions:
    def __init__(self, release: Callable[[int], None]) -> None:
        self._release = release
        self._maps: collections.OrderedDict[str, shm.Region] = collections.OrderedDict()
        self._open: dict[int, int] = {}  # call -> its outputs not collected yet
        self._collected: list[int] = []
        self._loop = asyncio.get_running_loop()

    def view(self, call: int, region: str, offset: int, nbytes: int) -> memoryview:
        if not shm.is_handle(region):
            raise InferdError(ErrorCode.INTERNAL, "an output refers to a region that is not a handle")
        mapped = self._maps.get(region)
        if mapped is None:
            mapped = self._maps[region] = shm.attach(region, readonly=True)
            while len(self._maps) > MAX_REGIONS:
                self._maps.popitem(last=False)[1].close()
        else:
            self._maps.move_to_end(region)
        if offset < 0 or nbytes < 0 or offset + nbytes > mapped.size:
            raise InferdError(ErrorCode.INTERNAL, "an output lies outside its region")
        root = np.frombuffer(mapped.buf, dtype=np.uint8, count=nbytes, offset=offset)
        self._open[call] = self._open.get(call, 0) + 1
        weakref.finalize(root, self._on_collected, call)
        return memoryview(root)  # type: ignore[arg-type]  # keeps `root` alive while any view of it lives

    def _on_collected(self, call: int) -> None:
        # may run from a garbage collection anywhere: only queue here, count and send from the loop
        if not self._collected:
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is closed: the process is going away
                return
        self._collected.append(call)

    def _flush(self) -> None:
        calls, self._collected = self._collected, []
        for call in calls:
            left = self._open.get(call, 1) - 1
            if left > 0:
                self._open[call] = left
            else:
                self._open.pop(call, None)
                self._release(call)

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()
