"""The worker's answers on the wire: a batch's results (or a decoupled request's responses) checked against
the model config and written as an ExecuteResult / ExecuteResultColumns / StreamResponse with wire.codec's
writers.

Where each output's bytes go: small ones into the message's data frames (FramePacker), numeric ones of
OUTPUT_SHM_MIN_BYTES or more into this worker's own output regions (worker/arena.py; the supervisor maps
them, passes them to an ensemble's next step by name and gives them back with ReleaseOutputs), device
outputs by CUDA IPC handle when another worker consumes them (held here until the supervisor releases
them), else copied to the host. An output that fails its check fails only its request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from . import bulk_copy, columns, tensors
from .arena import Arena
from .backends.base import ModelSpec, Request, Response
from .wire.errors import ErrorCode, InferdError
from .wire.messages import (
    ZERO_COPY_MIN_BYTES,
    FramePacker,
    WireError,
    device_ref_json,
    execute_result_columns_header,
    execute_result_header,
    output_ref_json,
    output_shm_ref_json,
    response_item_json,
    stream_response_header,
)

_now_ns = time.perf_counter_ns
_output_data = tensors.output_data
_ref_json = output_ref_json

# outputs this big are written into the worker's own shared memory instead of a ZeroMQ frame
OUTPUT_SHM_MIN_BYTES = 256 * 1024


def wire_error(exc: BaseException) -> WireError:
    if isinstance(exc, InferdError):
        return WireError(code=int(exc.code), message=exc.message)
    return WireError(code=int(ErrorCode.INTERNAL), message="%s: %s" % (type(exc).__name__, exc))


class ResultWriter:
    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._out_arena = Arena("o")  # large outputs (worker/arena.py), released by the supervisor
        # device outputs handed out by CUDA IPC handle, kept alive until the supervisor releases them:
        # key "<handle hex>:<offset>" -> the arrays (one per hand-out)
        self._device_exports: dict[str, list[Any]] = {}
        self._device_lock = threading.Lock()  # decoupled models export from their own threads
        self._model = ""
        self._instance = ""
        self._outputs: dict[str, tensors.OutputSpec] = {}
        self._output_names: list[str] = []
        self._check_output = tensors.check_output  # or tensors.output_as_returned (backend.checks_outputs)
        self._checked: Optional[frozenset[str]] = None  # see configure
        # (name, datatype, shape) of outputs `_check_output` passed as they were (a model's outputs come in
        # few shapes): the same again needs no check
        self._passed: set[tuple[str, str, Any]] = set()
        # a list while a direct peer's batch is answered: the output regions taken for it are noted here (the
        # message loop then counts them as that peer's, given back if it goes away: direct_peers.py)
        self.handed: Optional[list[str]] = None

    def configure(self, spec: ModelSpec, checks_outputs: bool = True) -> None:
        """The loaded model's outputs; `checks_outputs` False: a backend whose outputs go as returned."""
        self._model, self._instance = spec.model_name, spec.instance_name
        self._outputs = tensors.output_specs(spec.config)
        self._output_names = list(self._outputs)
        self._check_output = tensors.check_output if checks_outputs else tensors.output_as_returned
        # the outputs `_check_output` may change: all (None) where outputs are checked, else only those
        # whose configuration has a `reshape` (output_as_returned leaves the others as they are)
        self._passed = set()
        self._checked = None if checks_outputs else frozenset(
            name for name, spec in self._outputs.items() if spec.reshape is not None)

    # ---- messages -------------------------------------------------------------------------------

    def batch(self, batch_id: int, entries: list[Any], runnable: list[Request], results: Sequence[Response],
              times: tuple[int, int, int], failed: Optional[list[int]] = None) -> tuple[bytes, list[Any]]:
        """(ExecuteResult header, data frames) of one batch: `entries` per request its Request (answered by
        the next of `results`) or (request_id, WireError); `times` (decoded, executed, now) in ns. Ids of
        the requests answered with an error are added to `failed` if given (decoupled models)."""
        t0, t1, t2 = times
        if failed is None and len(runnable) == len(entries) > 1:
            by_columns = columns.output_columns(runnable, results, self._outputs, self._output_names,
                                                self._model, self._check_output)
            if by_columns is not None:
                layout, frames = by_columns
                return execute_result_columns_header(
                    batch_id, [r.request_id for r in runnable], layout, t1 - t0, t2 - t1,
                    _now_ns() - t2), frames
        packer = FramePacker()
        encode = self.item
        if len(runnable) == len(entries):
            items = []
            for request, result in zip(runnable, results):  # a loop, not a comprehension: no call
                items.append(encode(request, result, packer, failed))
        else:
            pending = iter(results)
            items = [encode(entry, next(pending), packer, failed) if type(entry) is Request
                     else self._error_item(entry[0], entry[1], failed) for entry in entries]
        out_frames = packer.finish()
        t3 = _now_ns()
        return execute_result_header(batch_id, items, t1 - t0, t2 - t1, t3 - t2), out_frames

    @staticmethod
    def failed_batch(batch_id: int, request_ids: Sequence[int], error: WireError) -> bytes:
        """The ExecuteResult header of a batch whose every request failed with `error`."""
        return execute_result_header(batch_id, [response_item_json(rid, (), error) for rid in request_ids])

    def stream_response(self, request: Request, response: Optional[Response], final: bool) -> tuple[bytes, list[Any]]:
        """(StreamResponse header, data frames) of one response of a decoupled request (None: flag-only)."""
        if response is None:
            return stream_response_header(request.request_id, final, None), []
        packer = FramePacker()
        item = self.item(request, response, packer)
        return stream_response_header(request.request_id, final, item), packer.finish()

    # ---- one response ---------------------------------------------------------------------------

    @staticmethod
    def _error_item(request_id: int, error: WireError, failed: Optional[list[int]],
                    params: Optional[dict[str, Any]] = None) -> str:
        if failed is not None:
            failed.append(request_id)
        return response_item_json(request_id, (), error, params)

    def item(self, request: Request, result: Response, packer: FramePacker,
             failed: Optional[list[int]] = None) -> str:
        """The ResponseItem JSON of one result; its outputs go into `packer`. A result with an error and
        outputs (a first response that stands beside the error, python_senders) carries both."""
        params = result.parameters
        if result.error is not None and not result.outputs:
            return self._error_item(request.request_id, wire_error(result.error), failed, params)
        model = self._model
        wanted = request.requested_outputs or self._output_names
        specs = self._outputs
        check = self._check_output
        checked = self._checked
        passed = self._passed
        outputs: list[tuple[Any, ...]] = []
        try:
            for out in result.outputs:
                name = out.name
                if name not in wanted:
                    continue
                datatype = out.datatype
                array = out.array
                if checked is None or name in checked:
                    shape = getattr(array, "shape", None)
                    # the check's verdict depends on these alone
                    if type(shape) is not tuple or (name, datatype, shape) not in passed:
                        given, array = array, check(specs.get(name), name, datatype, array, model)
                        if array is given and type(shape) is tuple and len(passed) < 1024:  # passed as it is
                            passed.add((name, datatype, shape))
                if type(array) is np.ndarray:
                    nbytes = array.nbytes  # tensors.output_data's usual case, inline: a small numeric
                    if nbytes < ZERO_COPY_MIN_BYTES and datatype != "BYTES" and datatype != "BF16" \
                            and array.flags.c_contiguous and array.dtype.byteorder != ">":  # array, as it is
                        outputs.append((name, datatype, array.shape, array, nbytes))
                        continue
                elif hasattr(array, "ptr"):  # a device.DeviceArray
                    outputs.append(self._device_output(request, name, datatype, array))
                    continue
                outputs.append((name, datatype) + _output_data(datatype, array))
        except Exception as exc:
            return self._error_item(request.request_id, wire_error(exc), failed, params)
        add = packer.add  # only once every output is checked: a failed request adds no frames
        refs: list[str] = []
        for name, datatype, shape, data, nbytes in outputs:  # a loop, not a comprehension: no call
            if nbytes < 0:  # a device reference, already written
                refs.append(data)
            elif nbytes >= OUTPUT_SHM_MIN_BYTES and datatype != "BYTES":
                refs.append(self._shm_ref(name, datatype, shape, data, nbytes, add))
            else:
                frame, offset = add(data, nbytes)
                refs.append(_ref_json(name, datatype, shape, frame, offset, nbytes))
        if result.error is not None:
            if failed is not None:
                failed.append(request.request_id)
            return response_item_json(request.request_id, refs, wire_error(result.error), params)
        return response_item_json(request.request_id, refs, None, params)

    def _shm_ref(self, name: str, datatype: str, shape: Any, data: Any, nbytes: int,
                 add: Callable[[Any, int], tuple[int, int]]) -> str:
        """A large output goes into one of this worker's regions (the supervisor maps it, and passes it
        to the next ensemble step by name); with the arena or /dev/shm full it rides as a frame after all."""
        try:
            region = self._out_arena.take(nbytes)
        except InferdError:  # /dev/shm is full: the answer still goes, by the socket
            region = None
        if region is None:
            frame, offset = add(data, nbytes)
            return _ref_json(name, datatype, shape, frame, offset, nbytes)
        bulk_copy.copy_into(region.buf, data)
        if self.handed is not None:
            self.handed.append(region.name)
        return output_shm_ref_json(name, datatype, shape, region.name, nbytes)

    def _device_output(self, request: Request, name: str, datatype: str, array: Any) -> tuple[Any, ...]:
        """A device output as an `outputs` entry of `item`: (name, datatype, shape, ref JSON, -1)
        when it may stay on the GPU, else the host copy's (name, datatype, shape, buffer, nbytes)."""
        from .wire.cuda_ipc import CudaIpcError

        if request.device_outputs:
            try:
                return name, datatype, array.shape, self._device_ref(request, name, array), -1
            except CudaIpcError as exc:  # e.g. memory this process cannot export: copy it out instead
                self._log("device output '%s' goes through host memory: %s" % (name, exc))
        return (name, datatype) + _output_data(datatype, array.to_numpy())

    def _device_ref(self, request: Request, name: str, array: Any) -> str:
        """A device output passed on by CUDA IPC handle (the consumer is another worker). An input of
        this request that came from another worker's memory goes on under its owner's reference
        (memory opened by IPC cannot be exported again; the supervisor holds it for the request); other
        memory opened from another worker (a BLS result) is first copied on the device into our own."""
        from . import device

        source = array.ref
        given = [getattr(t.array, "ref", None) for t in request.inputs]
        if source is not None and not any(
                ref is not None and ref.region == source.region and ref.offset == source.offset for ref in given):
            array, source = device.clone(array), None
        if source is not None:
            region, offset, owner = source.region, source.offset, source.owner
        else:
            region, offset = device.export(array)
            owner = self._instance
            with self._device_lock:
                self._device_exports.setdefault(device.ref_key(region, offset), []).append(array)
        return device_ref_json(name, array.datatype, array.shape, region, offset, array.nbytes, array.device, owner)

    # ---- what the supervisor gives back -----------------------------------------------------------

    def release(self, regions: list[str], device_keys: list[str]) -> None:
        """Output regions (ReleaseOutputs.regions) the supervisor no longer reads, and device outputs
        (ReleaseOutputs.device) no holder there keeps."""
        self._out_arena.give_back_names(regions)
        if device_keys:
            with self._device_lock:
                for key in device_keys:
                    held = self._device_exports.get(key)
                    if held:
                        held.pop()
                        if not held:
                            del self._device_exports[key]

    def close(self) -> None:
        """Free the output arena."""
        self._out_arena.close()
