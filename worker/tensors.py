"""Tensor conversion between the wire (TensorRef + frames / shm) and numpy, both ways.

Inputs become numpy views without a copy: `np.frombuffer` on the ZeroMQ frame or on a cached
mapping of the supervisor's shm region. They are writable, as in Triton (models edit inputs in
place): a frame belongs to this worker's message, and an input region is leased to one request only.
A region another worker owns (its output in an ensemble, a BLS caller's input) may have several
readers, so the model gets a private copy of those bytes. BYTES inputs decode into object arrays of
`bytes`; BF16 stays a raw little-endian uint16 view, marked "BF16" by its datatype.

Outputs are checked against the model configuration (declared, same datatype, compatible shape) and
leave as frames from the array's buffer (zero-copy from `wire.messages.ZERO_COPY_MIN_BYTES` up,
copied below); BYTES are serialized with the wire codec.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from . import bulk_copy
from .wire import bytes_codec, dtypes, shm
from .wire.errors import ErrorCode, InferdError, internal, invalid_arg
from .wire.messages import ZERO_COPY_MIN_BYTES, TensorRef

_BY_NAME = dtypes.BY_NAME
_new = object.__new__

BF16_VIEW = np.dtype("<u2")


def worker_owned(name: str) -> bool:
    """Supervisor pool regions are `inferd_<pid>_<n>`; worker arenas name theirs `inferd_<pid>_<tag><n>`
    with a one-letter tag (worker/arena.py)."""
    tail = shm.stem(name).rsplit("_", 1)[-1]
    return len(tail) > 1 and tail[0].isalpha() and tail[1:].isdigit()


def _close_client_handle(hex_handle: str) -> None:
    from .wire import cuda_ipc  # stdlib only at import; nothing is loaded unless the handle was opened

    try:
        cuda_ipc.close_handle(bytes.fromhex(hex_handle))
    except (ValueError, cuda_ipc.CudaIpcError):
        pass  # not a handle, or already gone: nothing to unmap


class ShmCache:
    """Mappings of supervisor-created regions, kept between Executes (LRU, bounded).

    The worker never unlinks. A region the supervisor has unlinked is dropped when it is listed in
    `Execute.forget_regions`, or, for a plain /dev/shm name (not a handle, which never changes
    object), when the name is found to point at a new file (inode changed).
    """

    def __init__(self, max_regions: int = 64) -> None:
        self._max = max_regions
        # the backend takes device inputs (FORCE_CPU_ONLY_INPUT_TENSORS "no", a framework on KIND_GPU):
        # a loc "cuda" input stays on the GPU; otherwise it is copied to the host here
        self.device_inputs = False
        self._regions: collections.OrderedDict[str, shm.Region] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._regions)

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        owned_by_worker = worker_owned(name)
        region = self._regions.get(name)
        if region is not None and not shm.is_handle(name) and shm.inode_of(name) != region.inode:
            self._drop(name)
            region = None
        if region is None:
            region = shm.attach(name, readonly=owned_by_worker)
            self._regions[name] = region
            while len(self._regions) > self._max:
                self._drop(next(iter(self._regions)))
        else:
            self._regions.move_to_end(name)
        if offset < 0 or nbytes < 0 or offset + nbytes > region.size:
            raise internal("tensor reference lies outside its shared memory region")
        if owned_by_worker:
            # another worker's region (its output, or a BLS caller's input) may feed several readers at
            # once: the model gets its own copy, so editing an input in place changes nothing shared (one
            # memcpy from a mapping kept between uses: cheaper than page-faulting a fresh private mapping)
            return bulk_copy.private_copy(region.buf[offset : offset + nbytes])
        return region.buf[offset : offset + nbytes]

    def forget(self, names: Sequence[str]) -> None:
        for name in names:
            if name.startswith("cuda:"):  # a client's CUDA shm region was unregistered: unmap its handle
                _close_client_handle(name[5:])
                continue
            self._drop(name)

    def _drop(self, name: str) -> None:
        region = self._regions.pop(name, None)
        if region is not None:
            region.close()  # unmapped later by GC if arrays still view it

    def close(self) -> None:
        for name in list(self._regions):
            self._drop(name)


def check_shape(shape: Any, tensor: str) -> tuple[int, ...]:
    if type(shape) is not list and not isinstance(shape, list):
        raise invalid_arg("invalid shape for tensor '%s'" % tensor)
    for s in shape:
        if type(s) is not int or s < 0:
            raise invalid_arg("invalid shape for tensor '%s'" % tensor)
    return tuple(shape)


def frame_buffers(frames: Sequence[Any]) -> list[memoryview]:
    """Byte views of a message's data frames (ZeroMQ Frames, bytes...), made once per message: the
    inputs packed into one frame are slices of the same view."""
    views = []
    for frame in frames:  # a loop, not comprehensions: no function calls per message
        if type(frame) is not memoryview:
            frame = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        views.append(frame if frame.format == "B" else frame.cast("B"))
    return views


def input_buffer(ref: TensorRef, frames: Sequence[Any], cache: ShmCache) -> Any:
    loc = ref.loc
    if loc == "frame":
        index = ref.frame
        if not 0 <= index < len(frames):
            raise internal("tensor '%s' refers to a missing data frame" % ref.name)
        frame = frames[index]
        buf = frame if type(frame) is memoryview else frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        offset, nbytes = ref.offset, ref.nbytes
        if offset == 0 and (nbytes == 0 or nbytes >= buf.nbytes):  # the whole frame (too short: input_array
            return buf  # says so); offset 0 + nbytes 0 is how references without a size name a whole frame
        # the supervisor packs small inputs into one frame: ours is the slice [offset, offset + nbytes)
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0 \
                or offset + nbytes > buf.nbytes:
            raise internal("tensor '%s' lies outside its data frame" % ref.name)
        return (buf if buf.format == "B" else buf.cast("B"))[offset : offset + nbytes]
    if loc == "shm":
        return cache.view(ref.region, ref.offset, ref.nbytes)
    raise internal("tensor '%s' has an unknown location '%s'" % (ref.name, loc))


def input_array(ref: TensorRef, frames: Sequence[Any], cache: ShmCache) -> Any:
    """The numpy view of one input tensor (see the module docstring); a `DeviceArray` for a device
    input when the backend takes them."""
    name = ref.name
    loc = ref.loc
    if loc == "cuda":
        return _device_input(ref, cache.device_inputs)
    dt = _BY_NAME.get(ref.datatype)
    if dt is None:
        raise invalid_arg("unsupported datatype '%s' for tensor '%s'" % (ref.datatype, name))
    shape: Any = ref.shape
    if type(shape) is not list:
        shape = check_shape(shape, name)
    count = 1
    for s in shape:
        if type(s) is not int or s < 0:
            raise invalid_arg("invalid shape for tensor '%s'" % name)
        count *= s
    shape = tuple(shape)
    if loc == "frame" and type(ref.frame) is int and 0 <= ref.frame < len(frames) \
            and type(frames[ref.frame]) is memoryview:  # the common case (input_buffer's first branch) inline
        buf = frames[ref.frame]
        offset, nbytes = ref.offset, ref.nbytes
        if not (offset == 0 and (nbytes == 0 or nbytes >= buf.nbytes)):
            if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0 \
                    or offset + nbytes > buf.nbytes:
                raise internal("tensor '%s' lies outside its data frame" % name)
            buf = (buf if buf.format == "B" else buf.cast("B"))[offset:offset + nbytes]
    else:
        buf = input_buffer(ref, frames, cache)
    if dt.itemsize == 0:  # BYTES
        return bytes_codec.deserialize(buf, count=count, name=name).reshape(shape)
    numpy_dtype = BF16_VIEW if dt.numpy is None else dt.numpy
    if type(buf) is not memoryview:
        buf = memoryview(buf)
    nbytes = buf.nbytes
    if nbytes != count * dt.itemsize:
        raise invalid_arg(
            "input '%s': expected %d bytes for shape %s of %s, got %d"
            % (name, count * dt.itemsize, list(shape), dt.name, nbytes)
        )
    return np.ndarray(shape, numpy_dtype, buf)  # one call: about half of np.frombuffer + reshape


def input_tensors(refs: Sequence[TensorRef], frames: Sequence[memoryview], cache: ShmCache,
                  tensor_type: type) -> list[Any]:
    """A request's inputs as `tensor_type`s (backends.base.Tensor, passed in: backends import this module)
    of `input_array`, the common case inline (a numeric input in a data frame: one call per request, not
    two per input); `frames` as `frame_buffers` gives them."""
    tensors = []
    for ref in refs:
        name, datatype, shape = ref.name, ref.datatype, ref.shape
        dt = _BY_NAME.get(datatype)
        index = ref.frame
        if dt is None or not dt.itemsize or ref.loc != "frame" or type(shape) is not list \
                or type(index) is not int or not 0 <= index < len(frames):
            array = input_array(ref, frames, cache)  # BYTES, shm, device memory, or a problem it names
        else:
            count = 1
            for s in shape:
                if type(s) is not int or s < 0:
                    raise invalid_arg("invalid shape for tensor '%s'" % name)
                count *= s
            buf = frames[index]
            offset, nbytes = ref.offset, ref.nbytes
            if not (offset == 0 and (nbytes == 0 or nbytes >= buf.nbytes)):
                if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0 \
                        or offset + nbytes > buf.nbytes:
                    raise internal("tensor '%s' lies outside its data frame" % name)
                buf = buf[offset:offset + nbytes]
            if buf.nbytes != count * dt.itemsize:
                raise invalid_arg("input '%s': expected %d bytes for shape %s of %s, got %d"
                                  % (name, count * dt.itemsize, shape, dt.name, buf.nbytes))
            array = np.ndarray(tuple(shape), BF16_VIEW if dt.numpy is None else dt.numpy, buf)
        tensor: Any = _new(tensor_type)  # Tensor(name, datatype, array) without an __init__ call
        tensor.name, tensor.datatype, tensor.array = name, datatype, array
        tensors.append(tensor)
    return tensors


def _device_input(ref: TensorRef, keep_on_device: bool) -> Any:
    """Another worker's device output: opened in place by its IPC handle (cached per process); the
    supervisor holds the producer's allocation until this request is answered."""
    from . import device  # CUDA is touched only when a device tensor arrives
    from .wire.cuda_ipc import CudaIpcError

    try:
        array = device.open_ref(ref)
        return array if keep_on_device else array.to_numpy()
    except (CudaIpcError, device.DeviceTensorError) as exc:
        if ref.owner.startswith("client:"):  # the client's memory (its process may have exited): a request error
            raise invalid_arg("input '%s': cannot open CUDA shared memory region '%s': %s"
                              % (ref.name, ref.owner[len("client:"):], exc)) from None
        raise internal("device input '%s' (from instance '%s'): %s" % (ref.name, ref.owner, exc)) from None


def input_reshapes(config: dict[str, Any]) -> dict[str, tuple[bool, list[int]]]:
    """{input name: (batched, shape)} for the inputs whose config has `reshape`: the model gets them in
    that shape (behind the batch dimension when max_batch_size > 0), not the shape clients send."""
    batched = int(config.get("max_batch_size") or 0) > 0
    out: dict[str, tuple[bool, list[int]]] = {}
    for inp in config.get("input") or []:
        reshape = inp.get("reshape")
        if isinstance(reshape, dict):
            out[inp["name"]] = (batched, [int(d) for d in reshape.get("shape") or []])
    return out


def reshape_input(array: np.ndarray, name: str, batched: bool, shape: list[int]) -> np.ndarray:
    target = ([array.shape[0]] if batched and array.ndim else []) + shape
    try:
        return array.reshape(target)
    except ValueError:
        raise invalid_arg(
            "input '%s' of shape %s cannot take the shape %s its configuration's reshape asks for"
            % (name, list(array.shape), target)
        ) from None


# ---- outputs ----------------------------------------------------------------------------------


class OutputSpec:
    """An output as declared in the config: protocol datatype, full expected shape (batch dim
    included as -1 when max_batch_size > 0) and the optional `reshape` shape the model produces."""

    __slots__ = ("name", "datatype", "config_type", "shape", "reshape")

    def __init__(
        self, name: str, datatype: str, config_type: str, shape: list[int], reshape: Optional[list[int]]
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.config_type = config_type
        self.shape = shape
        self.reshape = reshape


def output_specs(config: dict[str, Any]) -> dict[str, OutputSpec]:
    batch = [-1] if int(config.get("max_batch_size") or 0) > 0 else []
    specs: dict[str, OutputSpec] = {}
    for out in config.get("output") or []:
        config_type = str(out.get("data_type", "TYPE_INVALID"))
        dt = dtypes.BY_CONFIG_NAME.get(config_type)
        dims = [int(d) for d in out.get("dims") or []]
        reshape = out.get("reshape")
        reshape_shape = None
        if isinstance(reshape, dict) and "shape" in reshape:
            reshape_shape = batch + [int(d) for d in reshape.get("shape") or []]
        specs[out["name"]] = OutputSpec(
            out["name"], dt.name if dt else "", config_type, batch + dims, reshape_shape
        )
    # implicit sequence state: the model returns it like an output; the scheduler takes it back
    for state in (config.get("sequence_batching") or {}).get("state") or []:
        name = state.get("output_name")
        if name and name not in specs:
            config_type = str(state.get("data_type", "TYPE_INVALID"))
            dt = dtypes.BY_CONFIG_NAME.get(config_type)
            dims = [int(d) for d in state.get("dims") or []]
            specs[name] = OutputSpec(name, dt.name if dt else "", config_type, batch + dims, None)
    return specs


def _matches(shape: tuple[int, ...], pattern: list[int]) -> bool:
    if len(shape) != len(pattern):
        return False
    for s, p in zip(shape, pattern):  # noqa: SIM110 - a plain loop: no generator per output
        if p != s and p != -1:
            return False
    return True


def check_output(
    spec: Optional[OutputSpec], name: str, datatype: str, array: np.ndarray, model: str
) -> np.ndarray:
    """Validate one returned output of a framework backend (ONNX Runtime, PyTorch, TensorRT: their Triton
    backends check outputs against the configuration too); returns the array (reshaped from `reshape` to
    `dims` if the config asks for it). Raises INTERNAL naming the model and the output."""
    if spec is None:
        raise internal("output '%s' of model '%s' is not declared in the model configuration" % (name, model))
    if spec.datatype and datatype != spec.datatype:
        raise internal(
            "output '%s' of model '%s' has datatype %s but the model configuration declares %s"
            % (name, model, datatype, spec.config_type)
        )
    shape = tuple(array.shape)
    if _matches(shape, spec.shape):
        return array
    if spec.reshape is not None and _matches(shape, spec.reshape):
        target = [shape[0]] + spec.shape[1:] if spec.shape and spec.shape[0] == -1 else list(spec.shape)
        try:
            return array.reshape(target)
        except ValueError:
            pass
    raise internal(
        "output '%s' of model '%s' has shape %s, which does not match the model configuration %s"
        % (name, model, list(shape), spec.shape)
    )


def output_as_returned(
    spec: Optional[OutputSpec], name: str, datatype: str, array: np.ndarray, model: str
) -> np.ndarray:
    """One output of a Python model as it goes to the client. As Triton's Python backend: the datatype
    and shape are the model's, whatever the configuration declares (the response carries them; an
    ensemble's next step checks its own inputs). Only an output in the shape of the configuration's
    `reshape` (and not already in the shape of its `dims`) is reshaped to `dims`."""
    if spec is None or spec.reshape is None:
        return array
    shape = tuple(array.shape)
    if _matches(shape, spec.shape) or not _matches(shape, spec.reshape):
        return array
    target = [shape[0]] + spec.shape[1:] if spec.shape and spec.shape[0] == -1 else list(spec.shape)
    try:
        return array.reshape(target)
    except ValueError:  # dims and reshape with -1 that do not fit one another: as it is
        return array


def output_data(datatype: str, array: np.ndarray) -> tuple[tuple[int, ...], Any, int]:
    """(shape, C-contiguous little-endian buffer, nbytes) of one checked output; numeric buffers are
    not copied here."""
    if datatype == "BYTES":
        data: Any = bytes_codec.serialize(array)
        return array.shape, data, len(data)
    dtype = array.dtype
    if datatype == "BF16" and dtype != BF16_VIEW:
        array = array.view(BF16_VIEW) if dtype.itemsize == 2 else array
        dtype = array.dtype
    if dtype.byteorder == ">":
        array = array.astype(dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    nbytes = array.nbytes
    if nbytes < ZERO_COPY_MIN_BYTES:  # copied into the shared frame: any C-contiguous buffer does
        return array.shape, array, nbytes
    return array.shape, array.reshape(-1).view(np.uint8), nbytes  # a flat byte view for a zero-copy frame


def error_code(exc: BaseException) -> ErrorCode:
    return exc.code if isinstance(exc, InferdError) else ErrorCode.INTERNAL
