"""Large outputs that a worker wrote into its own shared-memory regions instead of ZeroMQ frames.

The supervisor maps each such region read-only (once; the worker reuses its regions) and hands the
output on as a view of the mapping with `Tensor.shm_ref` set, so an ensemble's next step
gets the region by name and the bytes never enter the supervisor's heap. When the last view of an
output is garbage collected (the response was written, the next step answered), the region's name goes
back to the worker in a ReleaseOutputs message, batched per event-loop pass.

Device outputs (TensorRef loc "cuda") stay in the worker's GPU memory: each becomes a share in
memory/device_refs.TABLE, and the worker is told (ReleaseOutputs.device) when the last holder let go.
When the worker exits its device memory is declared dead there.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from inferd.worker.wire import shm

from ..memory.device_refs import ALLOCATOR, TABLE, DeviceRef, device_key


class WorkerOutputs:
    def __init__(self, release: Callable[[list[str]], None], identity: str = "", name: str = "",
                 release_device: Callable[[list[str]], None] | None = None) -> None:
        self._release = release  # sends ReleaseOutputs(names) to the worker
        self._identity = identity  # the worker process: owner of its device allocations
        self._name = name  # its instance name, as TensorRef.owner carries it
        if identity and release_device is not None:
            ALLOCATOR.attach(identity, release_device)
        self._maps: dict[str, shm.Region] = {}
        self._pending: list[str] = []
        self._loop = asyncio.get_running_loop()
        self._closed = False

    def view(self, region: str, offset: int, nbytes: int) -> memoryview:
        """The output's bytes (a view of the worker's region); ValueError for a bad reference."""
        if not shm.valid_name(region):
            raise ValueError(f"invalid output region {region!r}")
        mapped = self._maps.get(region)
        if mapped is None:
            mapped = self._maps[region] = shm.attach(region, readonly=True)
        if offset < 0 or nbytes < 0 or offset + nbytes > mapped.size:
            raise ValueError(f"output lies outside region {region!r}")
        root = np.frombuffer(mapped.buf, dtype=np.uint8, count=nbytes, offset=offset)
        weakref.finalize(root, self._collected, region)
        # a memoryview (what every consumer of tensor bytes takes) keeps `root` alive while it lives
        return memoryview(root)  # type: ignore[arg-type]  # ndarray exports the buffer protocol

    def _collected(self, region: str) -> None:
        # may run from a garbage collection anywhere: only queue here, send from the loop
        if self._closed:
            return
        if not self._pending:
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is closed: the worker is going away too
                return
        self._pending.append(region)

    def _flush(self) -> None:
        names, self._pending = self._pending, []
        if names and not self._closed:
            self._release(names)

    def device(self, name: str, ref: Any, inputs: Sequence[Any] = ()) -> DeviceRef:
        """A device output (loc "cuda", `ref` a TensorRef): the worker's own memory, or an input it was
        given and handed back (then it must be one of `inputs`, the request's tensors). ValueError for
        a reference this worker may not send."""
        region, offset, device, owner, nbytes = ref.region, ref.offset, ref.device, ref.owner, ref.nbytes
        if not (type(region) is str and len(region) == 128 and type(offset) is int and offset >= 0
                and type(nbytes) is int and nbytes >= 0 and type(device) is int and device >= 0
                and type(owner) is str):
            raise ValueError(f"output '{name}' has a bad device reference")
        key = device_key(region, offset)
        if owner == self._name:
            share = TABLE.register(self._identity, key, self._name)
        else:
            given = next((t.device_ref for t in inputs if t.device_ref is not None and t.device_ref.key() == key
                          and t.device_ref.share.label == owner), None)
            if given is None:
                raise ValueError(f"output '{name}' refers to device memory of '{owner}' it was not given")
            share = given.share.share()
        return DeviceRef(share, region, offset, nbytes, device)

    def close(self) -> None:
        """The worker is gone: forget its mappings (views still held stay valid until collected)."""
        if self._identity and not self._closed:
            ALLOCATOR.detach(self._identity)
            TABLE.producer_died(self._identity)
        self._closed = True
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()
