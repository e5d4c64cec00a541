"""Turning a batch of InferRequests into one Execute's request items and data frames.

Inputs up to INLINE_MAX_BYTES ride as frames (the small ones packed into one, each at its offset);
larger ones are written into shared-memory pool leases, or, when already in a region a worker owns
(a BLS input), passed by that region's name. The packer remembers which pool regions its worker has
seen, so each Execute can list the ones unlinked since (`forget_regions`) and the worker drops its
stale mappings. A decoupled request keeps its leases (in its OpenStream) until its final response;
other requests' leases go back with the batch's result. A batch of alike small requests goes by columns
instead (`wire.messages.ExecuteColumns`): one frame per input, no per-request items. The header is written
by wire.codec (`execute_header`, `execute_columns_header`) from the plain values taken here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.tensors import element_count
from ..inference.types import InferRequest
from ..memory.cuda_regions import CudaSpan
from ..tracing import live


class OpenStream:
    """An open decoupled request: where its responses go, and the input leases it holds."""

    __slots__ = ("request", "sink", "leases")

    def __init__(self, request: InferRequest, leases: list[Any]) -> None:
        self.request = request
        self.sink = request.response_sink
        self.leases = leases


@dataclass
class Packed:
    frames: list[Any] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # worker-side request ids, one per request
    leases: list[Any] = field(default_factory=list)  # released when the batch is answered
    forget: list[str] = field(default_factory=list)
    streams: dict[int, OpenStream] = field(default_factory=dict)  # request id -> decoupled request
    # an ExecuteColumns instead of `items`: (request ids, inputs (name, datatype, shape), client ids, outputs)
    columns: tuple[list[int], list[tuple[str, str, list[int]]], list[str], list[str]] | None = None

    def header(self, batch_id: int, poll_us: int = 0) -> bytes:
        """The Execute (or ExecuteColumns) header frame of this batch; `frames` follow it. `poll_us`: how
        long the worker polls for its next message once this batch is answered (0: it sleeps)."""
        if self.columns is None:
            return m.execute_header(batch_id, self.items, self.forget, poll_us)
        return m.execute_columns_header(batch_id, *self.columns, self.forget, poll_us)


def request_item(request_id: int, req: InferRequest, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """`req` as an Execute's request item (wire.codec.request_item); `inputs` from wire.codec.tensor_ref."""
    cid, trace = req.correlation_id, req.trace
    if (req.parameters or req.flags or req.timeout_us or req.device_outputs or trace is not None
            or not (type(cid) is int and cid == 0)):
        return m.request_item(request_id, req.id, inputs, [o.name for o in req.outputs],
                              json.dumps(req.parameters) if req.parameters else "{}", cid, req.flags,
                              req.timeout_us, req.device_outputs, "" if trace is None else str(trace.id))
    # the other fields at default
    return m.request_item(request_id, req.id, inputs, [o.name for o in req.outputs] if req.outputs else [])


def release_leases(leases: list[Any]) -> None:
    for lease in leases:
        lease.release()
    leases.clear()


class InputPacker:
    def __init__(self, pool: Any, device: int | None = None) -> None:
        self._pool = pool  # memory.shm_pool.ShmPool; None: inputs above INLINE_MAX_BYTES are refused
        self._device = device  # the worker's GPU (KIND_GPU instance); None: a CPU instance
        self._request_ids = itertools.count(1)
        self._regions_seen: set[str] = set()
        self._pool_epoch = -1
        self._cuda_seen: dict[bytes, Any] = {}  # client CUDA handles the worker was given -> their table

    def pack(self, requests: Sequence[InferRequest]) -> Packed:
        pool = self._pool
        # (nothing to forget, the usual case, without a call)
        forget = (self._forget() if self._cuda_seen or (pool is not None and pool.epoch != self._pool_epoch)
                  else [])
        if len(requests) > 1 and not live.armed:  # traced requests each carry their trace id in their item
            by_columns = self._pack_columns(requests)
            if by_columns is not None:
                by_columns.forget = forget
                return by_columns
        out = Packed([], [], [], [], forget, {})  # (positional: the field factories cost more)
        # inputs below ZERO_COPY_MIN_BYTES are packed into frame 0, each at its offset: a ZeroMQ frame
        # costs a send here and a receive (with a Frame object) in the worker, more than the copy
        frames = out.frames
        frames.append(b"")
        small: list[Any] = []
        size = 0
        try:
            for req in requests:
                rid = next(self._request_ids)
                refs = []
                if req.response_sink is not None:  # a decoupled request keeps its leases until its final
                    stream = out.streams[rid] = OpenStream(req, [])
                    req_leases = stream.leases
                else:
                    req_leases = out.leases
                for t in req.inputs:
                    device = t.device_ref
                    if device is not None:  # stays on its GPU: the worker opens it by IPC handle
                        device.share.check()
                        refs.append(m.tensor_ref(t.name, t.datatype, t.shape, "cuda", -1, device.region,
                                                 device.offset, device.nbytes, device.device,
                                                 device.share.label))
                        continue
                    data = t.data
                    if type(data) is CudaSpan:  # in a client's CUDA region
                        if self._device == data.device:  # a worker on that GPU opens the handle: no host copy
                            self._cuda_seen[data.handle] = data.table
                            refs.append(m.tensor_ref(t.name, t.datatype, t.shape, "cuda", -1, data.handle.hex(),
                                                     data.offset, data.nbytes, data.device, data.owner))
                            continue
                        data = data.to_host()
                    nbytes = (len(data) if type(data) is bytes else data.nbytes if isinstance(data, memoryview)
                              else memoryview(data).nbytes)
                    if nbytes <= m.INLINE_MAX_BYTES:
                        if 0 < nbytes < m.ZERO_COPY_MIN_BYTES:  # (offset 0, nbytes 0) would mean a whole frame
                            refs.append(m.tensor_ref(t.name, t.datatype, t.shape, "frame", 0, "", size, nbytes))
                            small.append(data)
                            size += nbytes
                        else:
                            refs.append(m.tensor_ref(t.name, t.datatype, t.shape, "frame", len(frames), "", 0,
                                                     nbytes))
                            frames.append(data)
                        continue
                    if t.shm_ref is not None:  # already in shared memory (a BLS input): pass the handle
                        refs.append(m.tensor_ref(t.name, t.datatype, t.shape, "shm", -1, t.shm_ref[0],
                                                 t.shm_ref[1], nbytes))
                        continue
                    if pool is None:
                        raise InferdError(ErrorCode.UNAVAILABLE, f"no shared memory for input '{t.name}'")
                    lease = pool.lease(nbytes)
                    req_leases.append(lease)
                    lease.write(data)
                    self._regions_seen.add(lease.name)
                    refs.append(m.tensor_ref(t.name, t.datatype, t.shape, "shm", -1, lease.name,
                                             lease.offset, nbytes))
                out.items.append(request_item(rid, req, refs))
                out.ids.append(rid)
        except BaseException:
            release_leases(out.leases)
            for stream in out.streams.values():
                release_leases(stream.leases)
            raise
        if small:
            frames[0] = small[0] if len(small) == 1 else b"".join(small)
        elif len(frames) == 1:
            frames.clear()  # no inline input at all
        return out

    def _forget(self) -> list[str]:
        """Pool regions unlinked since the worker last heard: it drops its mappings of them. Client CUDA
        handles no longer registered go as "cuda:<hex handle>": the worker closes its IPC mapping."""
        if self._cuda_seen:
            gone = [h for h, table in self._cuda_seen.items() if not table.is_open(h)]
            for h in gone:
                del self._cuda_seen[h]
            if gone:
                return ["cuda:" + h.hex() for h in gone] + self._forget_pool()
        return self._forget_pool()

    def _forget_pool(self) -> list[str]:
        pool = self._pool
        if pool is None or pool.epoch == self._pool_epoch:
            return []
        self._pool_epoch = pool.epoch
        forget = [name for name in self._regions_seen if not pool.is_live(name)]
        self._regions_seen.difference_update(forget)
        return forget

    def _pack_columns(self, requests: Sequence[InferRequest]) -> Packed | None:
        """The batch as an ExecuteColumns (one frame per input) when its requests differ only in their
        tensor bytes and client ids (see wire.messages.ExecuteColumns); None otherwise."""
        first = requests[0]
        layout = []
        for t in first.inputs:
            dt = BY_NAME.get(t.datatype)
            if (dt is None or dt.itemsize == 0 or t.shm_ref is not None or t.device_ref is not None
                    or type(t.data) is CudaSpan):
                return None
            nbytes = element_count(t.shape) * dt.itemsize
            if nbytes >= m.ZERO_COPY_MIN_BYTES:
                return None
            layout.append((t.name, t.datatype, t.shape, nbytes))
        wanted = [o.name for o in first.outputs]
        columns: list[list[Any]] = [[] for _ in layout]
        ids: list[str] = []
        if len(layout) == 1:  # one input: what most models take
            if not self._one_input_column(requests, layout[0], wanted, columns[0], ids):
                return None
            requests = ()  # (all taken)
        for req in requests:
            if (req.response_sink is not None or req.parameters or req.flags or req.timeout_us or req.device_outputs
                    or not (type(req.correlation_id) is int and req.correlation_id == 0)
                    or len(req.inputs) != len(layout) or len(req.outputs) != len(wanted)):
                return None
            for t, (name, datatype, shape, nbytes), column in zip(req.inputs, layout, columns):
                data = t.data
                if (t.name != name or t.datatype != datatype or t.shape != shape or t.shm_ref is not None
                        or type(data) is CudaSpan
                        or (data.nbytes if type(data) is memoryview else memoryview(data).nbytes) != nbytes):
                    return None
                column.append(data)
            if wanted and [o.name for o in req.outputs] != wanted:
                return None
            ids.append(req.id)
        request_ids = list(itertools.islice(self._request_ids, len(ids)))
        inputs = [(name, datatype, shape) for name, datatype, shape, _ in layout]
        return Packed(frames=[b"".join(column) for column in columns], ids=request_ids,
                      columns=(request_ids, inputs, ids, wanted))

    @staticmethod
    def _one_input_column(requests: Sequence[InferRequest], layout: tuple[str, str, list[int], int],
                          wanted: list[str], column: list[Any], ids: list[str]) -> bool:
        """`_pack_columns`' loop for a model of one input, its checks in short (no zip, no memoryview of
        bytes, look-ups out of the loop): False when a request does not fit, else `column` and `ids`
        filled."""
        name, datatype, shape, nbytes = layout
        n_wanted = len(wanted)
        append, append_id, span = column.append, ids.append, CudaSpan
        for req in requests:
            if (req.response_sink is not None or req.parameters or req.flags or req.timeout_us or req.device_outputs
                    or not (type(req.correlation_id) is int and req.correlation_id == 0)):
                return False
            inputs, outputs = req.inputs, req.outputs
            if len(inputs) != 1 or len(outputs) != n_wanted:
                return False
            t = inputs[0]
            data = t.data
            kind = type(data)
            if (t.name != name or t.datatype != datatype or t.shape != shape or t.shm_ref is not None
                    or (len(data) if kind is bytes else data.nbytes if kind is memoryview
                        else -1 if kind is span else memoryview(data).nbytes) != nbytes):
                return False
            if n_wanted and [o.name for o in outputs] != wanted:
                return False
            append(data)
            append_id(req.id)
        return True
