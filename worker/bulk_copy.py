"""Copies of tensor bytes that let the worker's other threads run. A memoryview slice assignment or
`bytearray(view)` holds the GIL for the whole memcpy (about half a second per 512 MiB on a small VM),
so the heartbeat thread falls silent and the supervisor may take the worker for hung; numpy's copy
releases the GIL (and is several times faster on fresh pages)."""

from __future__ import annotations

from typing import Any

import numpy as np

# below this a plain copy is cheaper than building arrays around the buffers
SMALL = 1 << 20


def copy_into(dst: Any, src: Any) -> None:
    """Copy the bytes of `src` to the start of the writable buffer `dst`."""
    source = src if isinstance(src, memoryview) else memoryview(src)
    nbytes = source.nbytes
    if nbytes < SMALL:
        dst[:nbytes] = source.cast("B") if source.format != "B" or source.ndim != 1 else source
        return
    np.copyto(np.frombuffer(dst, np.uint8, nbytes), np.frombuffer(source, np.uint8, nbytes))


def private_copy(src: memoryview) -> memoryview:
    """A writable copy of `src` that nobody else sees."""
    if src.nbytes < SMALL:
        return memoryview(bytearray(src))
    out = np.empty(src.nbytes, np.uint8)
    np.copyto(out, np.frombuffer(src, np.uint8, src.nbytes))
    return memoryview(out)  # type: ignore[arg-type]
