"""Model warmup (config `model_warmup`, reference/triton.md §3.9): samples run on every instance
after its worker loaded the model and before the instance takes traffic.

As Triton 2.51 (observed with its Python backend):
- a sample with `batch_size` 0 is skipped; `count` 0 runs once; samples run in config order;
- a sample is `batch_size` requests executed together as one batch; every input is `dims` (all
  fixed) with a batch dimension of 1 in front when the model batches (`max_batch_size` > 0);
- `zero_data`: zeros (BYTES: empty elements); `random_data`: random bytes (BYTES: empty elements,
  as zero_data); `input_data_file`: `<model dir>/warmup/<file>`, its first bytes (BYTES: the whole
  file, 4-byte length prefixed elements); inputs the config does not declare (control inputs) are
  passed as given;
- the requests are checked as client requests are; a sample that is malformed, or a response (or
  decoupled stream) that carries an error, fails the model load naming the sample;
- warmup executions count in the model's statistics.

Every sample's size is checked before anything is allocated. The samples are built and checked once
per load (input_data_files read then, and kept); zero and random data are made afresh for each run, so
an instance restarted after a crash (instances.instance.Instance.warmup) is warmed again without that
data being held in between.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire import dtypes
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg

from ..inference.limits import MAX_DIMS
from ..inference.types import InferRequest, Tensor
from .streaming import ResponseStream
from .validate import IOSpec, validate_request

log = logging.getLogger("inferd.warmup")

WARMUP_DIR = "warmup"
# what one execution of a sample may send to a worker: batch_size x the bytes of one request's inputs
MAX_SAMPLE_BYTES = 512 << 20
MAX_SAMPLES = 1024  # samples in one config
MAX_COUNT = 1 << 20  # runs of one sample
_ZERO, _RANDOM, _FILE = "zero_data", "random_data", "input_data_file"


@dataclass(frozen=True)
class WarmupInput:
    name: str
    datatype: str  # protocol name, e.g. "FP32"
    shape: tuple[int, ...]  # as sent: batch dimension of 1 included when the model batches
    kind: str  # zero_data | random_data | input_data_file
    nbytes: int
    file_data: bytes = b""  # input_data_file: exactly the bytes sent

    def data(self) -> bytes:
        if self.kind == _FILE:
            return self.file_data
        if self.kind == _RANDOM and self.datatype != "BYTES":
            raw = os.urandom(self.nbytes)
            # Triton sends raw random bytes; BOOL gets 0/1 so that each element is a valid bool
            return raw.translate(_LOW_BIT) if self.datatype == "BOOL" else raw
        return bytes(self.nbytes)  # zeros; for BYTES: empty elements (4-byte zero lengths)


_LOW_BIT = bytes(i & 1 for i in range(256))


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int  # requests per execution
    count: int  # executions
    inputs: tuple[WarmupInput, ...]

    def requests(self, model_name: str, version: str, decoupled: bool) -> list[InferRequest]:
        """One execution's requests (fresh data and request objects each time)."""
        tensors = [(i, i.data()) for i in self.inputs]
        out = []
        for _ in range(self.batch_size):
            req = InferRequest(model_name, version,
                               inputs=[Tensor(i.name, i.datatype, list(i.shape), data) for i, data in tensors])
            if decoupled:
                req.response_sink = ResponseStream()
            out.append(req)
        return out


def _sample_error(sample: str, detail: str) -> InferdError:
    return invalid_arg("invalid warmup sample '%s': %s" % (sample, detail))


def _int(value: Any, what: str, sample: str, limit: int) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise _sample_error(sample, "%s must be an integer from 0 to %d, got %r" % (what, limit, value))
    return value


def _read_file(model_dir: str, rel: Any, sample: str, input_name: str, datatype: str,
               nbytes: int, limit: int) -> bytes:
    """The bytes of an input_data_file: `nbytes` of them (fixed-size types), or the whole file
    (BYTES); never more than `limit` read."""
    base = os.path.join(model_dir, WARMUP_DIR)
    norm = os.path.normpath(rel) if isinstance(rel, str) else ""
    if (not norm or norm == "." or os.path.isabs(norm) or norm.split(os.sep)[0] == ".." or "\0" in norm):
        raise _sample_error(sample, "input_data_file %r of input '%s' must name a file inside the model's "
                                    "'%s' directory" % (rel, input_name, WARMUP_DIR))
    path = os.path.join(base, norm)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _sample_error(sample, "input_data_file %s of input '%s' is not a regular file" % (path, input_name))
        with open(path, "rb") as f:
            data = f.read((limit if datatype == "BYTES" else nbytes) + 1)
    except OSError as exc:
        raise _sample_error(sample, "failed to read input_data_file %s: %s" % (path, exc.strerror or exc)) from None
    if datatype == "BYTES":
        if len(data) > limit:
            raise _sample_error(sample, "input_data_file %s of input '%s' is larger than the %d bytes a warmup "
                                        "sample may hold" % (path, input_name, limit))
        return data
    if len(data) < nbytes:
        raise _sample_error(sample, "warmup setting expects %d bytes for input '%s', but the data provided from "
                                    "%s only has %d bytes" % (nbytes, input_name, norm, len(data)))
    return data[:nbytes]


def _build_input(name: str, entry: Any, sample: str, batch_size: int, io: IOSpec, model_dir: str,
                 budget: int) -> WarmupInput:
    if not isinstance(entry, dict):
        raise _sample_error(sample, "input '%s' must be an object" % name)
    dt = dtypes.BY_CONFIG_NAME.get(entry.get("data_type", ""))
    if dt is None:
        raise _sample_error(sample, "input '%s' has an invalid data_type %r" % (name, entry.get("data_type")))
    dims = entry.get("dims", [])
    if not isinstance(dims, list) or len(dims) > MAX_DIMS or any(type(d) is not int for d in dims):
        raise _sample_error(sample, "dims of input '%s' must be at most %d integers" % (name, MAX_DIMS))
    if any(d < 0 for d in dims):
        raise _sample_error(sample, "warmup setting expects all variable-size dimensions are specified for "
                                    "input '%s'" % name)
    kinds = [k for k in (_ZERO, _RANDOM, _FILE) if k in entry]
    if not kinds:
        raise _sample_error(sample, "warmup setting expects input '%s' to have input_data_type set" % name)
    kind = kinds[0]
    count = dtypes.element_count(dims)
    # BYTES zero/random data: every element empty (a 4-byte zero length), as Triton
    nbytes = count * (dt.itemsize or 4)
    # one request's bytes x batch_size must fit: checked before anything is allocated
    if nbytes * batch_size > budget:
        raise _sample_error(sample, "input '%s' (%s %s, %d requests) takes the sample beyond the %d bytes a "
                                    "warmup sample may hold" % (name, dt.name, dims, batch_size, MAX_SAMPLE_BYTES))
    shape = ((1,) if io.max_batch_size > 0 else ()) + tuple(dims)
    if kind != _FILE:
        return WarmupInput(name, dt.name, shape, kind, nbytes)
    data = _read_file(model_dir, entry.get(_FILE), sample, name, dt.name, nbytes, budget // batch_size)
    return WarmupInput(name, dt.name, shape, kind, len(data), data)


def _build_sample(entry: Any, io: IOSpec, model_dir: str) -> WarmupSample | None:
    if not isinstance(entry, dict):
        raise invalid_arg("invalid model_warmup entry %r" % (entry,))
    name = entry.get("name", "")
    name = name if isinstance(name, str) else repr(name)
    batch_size = _int(entry.get("batch_size", 0), "batch_size", name, 1 << 31)
    if batch_size == 0:
        log.debug("model '%s': skipping warmup sample '%s' (batch_size 0)", io.model_name, name)
        return None
    allowed = max(io.max_batch_size, 1)  # as the Python backend: more items than max_batch_size fail
    if batch_size > allowed:
        raise invalid_arg("failed to run warmup sample '%s': batch size %d for '%s', max allowed is %d"
                          % (name, batch_size, io.model_name, io.max_batch_size))
    count = max(_int(entry.get("count", 0), "count", name, MAX_COUNT), 1)
    given = entry.get("inputs") or {}
    if not isinstance(given, dict):
        raise _sample_error(name, "inputs must be a map of input name to input")
    budget = MAX_SAMPLE_BYTES
    declared = [n for n in io.inputs if n in given]  # the config's order first, then the others
    inputs = []
    for input_name in declared + sorted(n for n in given if n not in io.inputs):
        inp = _build_input(input_name, given[input_name], name, batch_size, io, model_dir, budget)
        budget -= inp.nbytes * batch_size
        inputs.append(inp)
    sample = WarmupSample(name, batch_size, count, tuple(inputs))
    _check_request(sample, io)
    return sample


def _check_request(sample: WarmupSample, io: IOSpec) -> None:
    """The checks a client request gets, on the inputs the config declares (the others are passed
    through as Triton's override inputs)."""
    def data(i: WarmupInput) -> Any:
        if i.kind == _FILE or not i.nbytes:
            return i.file_data
        return mmap.mmap(-1, i.nbytes)  # zeros whose pages are never touched: the size is checked, not held

    request = InferRequest(io.model_name, inputs=[Tensor(i.name, i.datatype, list(i.shape), data(i))
                                                  for i in sample.inputs
                                                  if i.name in io.inputs and i.name not in io.injected])
    try:
        validate_request(io, request)
    except InferdError as exc:
        raise _sample_error(sample.name, exc.message) from None


def build_samples(config: dict[str, Any], model_dir: str) -> list[WarmupSample]:
    """The samples of a (normalised, Triton JSON) config, checked; InferdError(INVALID_ARG) names the
    sample that is wrong. Reads input_data_files: call it off the event loop."""
    entries = config.get("model_warmup") or []
    if not isinstance(entries, list) or len(entries) > MAX_SAMPLES:
        raise invalid_arg("model_warmup must be a list of at most %d samples" % MAX_SAMPLES)
    if not entries:
        return []
    io = IOSpec.from_config(config)
    return [s for s in (_build_sample(e, io, model_dir) for e in entries) if s is not None]


class Warmer:
    """Runs a model's samples on one freshly started worker (`await warmer(worker)`), directly, not
    through the scheduler; raises InferdError naming the sample that failed."""

    def __init__(self, model_name: str, version: str, samples: Sequence[WarmupSample], stats: Any,
                 decoupled: bool = False) -> None:
        self.model_name = model_name
        self.version = version
        self.samples = tuple(samples)
        self.stats = stats
        self.decoupled = decoupled

    async def __call__(self, worker: Any) -> None:
        for sample in self.samples:
            for iteration in range(1, sample.count + 1):
                log.debug("model '%s' instance '%s' is running warmup sample '%s' for iteration %d",
                          self.model_name, worker.name, sample.name, iteration)
                errors = await self._run(worker, sample)
                if errors:
                    raise InferdError(ErrorCode.INVALID_ARG, "failed to run warmup sample '%s': %s"
                                      % (sample.name, "; ".join(dict.fromkeys(errors))))

    async def _run(self, worker: Any, sample: WarmupSample) -> list[str]:
        requests = sample.requests(self.model_name, self.version, self.decoupled)
        start = time.monotonic_ns()
        try:
            result = await worker.execute(requests)
        except InferdError as exc:
            return [exc.message]
        errors = [r.message for r in result.responses if isinstance(r, InferdError)]
        if self.decoupled:
            errors = await _stream_errors(requests)
        if not errors:
            _record(self.stats, result, requests, start)
        return errors


async def _stream_errors(requests: Sequence[InferRequest]) -> list[str]:
    """Drain each decoupled request's responses up to its final one; the errors among them."""
    errors: list[str] = []
    for req in requests:
        stream: ResponseStream = req.response_sink
        ended = False
        while not ended:
            item, ended = await stream.get()
            if isinstance(item, InferdError):
                errors.append(item.message)
    return errors


def _record(stats: Any, result: Any, requests: Sequence[InferRequest], start_ns: int) -> None:
    """Triton counts warmup executions as it counts any other: one execution of len(requests)
    items, and each request a success."""
    end = time.monotonic_ns()
    ci, cinf, co = result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns
    stats.record_execution(len(requests), ci, cinf, co)
    for req in requests:
        stats.record_success(1, end - req.arrival_ns, start_ns - req.arrival_ns, ci, cinf, co)


async def build_warmer(config: dict[str, Any], model_dir: str, model_name: str, version: str,
                       stats: Any) -> Warmer | None:
    """A Warmer for the config's samples (None when it has none that run); the files are read in a
    thread."""
    if not config.get("model_warmup"):
        return None
    samples = await asyncio.to_thread(build_samples, config, model_dir)
    decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
    return Warmer(model_name, version, samples, stats, decoupled) if samples else None
