"""The response cache (Triton's `local` cache): successful responses kept by request hash, LRU by bytes.

A model uses it only when the server was started with `--cache-config local,size=BYTES` and the
model's config says `response_cache { enable: true }` (and it is neither decoupled nor sequence
batched: reference/triton.md §6.7). The key is a blake2b hash of a canonical encoding of what
decides the answer: model name and loaded version (its load generation, so a reload never serves
answers of the old files), every input (name, datatype, shape, bytes, parameters), the requested
outputs with the parameters that change them (classification; not transport details such as
binary_data or shared memory placement) and the request's custom parameters.

Entries own plain `bytes` copies of the output tensors (responses hold views into worker frames);
a hit hands out fresh response/tensor objects over those immutable bytes, so nothing a frontend
does to a response can change what the next hit returns.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from typing import Any

from .inference.types import InferRequest, InferResponse, Tensor

ENTRY_OVERHEAD = 128  # bytes charged per entry for its key and bookkeeping
TENSOR_OVERHEAD = 64  # bytes charged per output tensor for its name, shape and object

# requested-output parameters that only say how or where the bytes travel, not what they are
_TRANSPORT_PARAMS = ("binary_data", "binary_data_size")


class CacheSettings:
    """What `--cache-config` asked for. Only the `local` cache exists; its one setting is `size`."""

    __slots__ = ("size_bytes",)

    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes


def parse_cache_config(values: list[str]) -> CacheSettings | None:
    """Triton's `--cache-config <cache>,<key>=<value>` (repeatable). Raises ValueError naming the problem."""
    if not values:
        return None
    size: int | None = None
    for text in values:
        name, sep, setting = text.partition(",")
        name = name.strip()
        if not sep or "=" not in setting:
            raise ValueError(f"--cache-config expects <cache_name>,<key>=<value>, got {text!r}")
        if name != "local":
            raise ValueError(f"cache '{name}' is not supported (inferd has the 'local' cache only)")
        key, _, value = setting.partition("=")
        key, value = key.strip(), value.strip()
        if key != "size":
            raise ValueError(f"unknown setting '{key}' for the local cache (it takes 'size' in bytes)")
        try:
            size = int(value)
        except ValueError:
            raise ValueError(f"local cache size must be a whole number of bytes, got {value!r}") from None
        if size < 0:
            raise ValueError(f"local cache size must not be negative, got {size}")
    if size is None:
        raise ValueError("the local cache needs a size: --cache-config local,size=<bytes>")
    return CacheSettings(size)


def model_wants_cache(config: dict[str, Any]) -> bool:
    """The model's config enables the cache and its scheduling allows it (not decoupled, not sequences)."""
    if not (config.get("response_cache") or {}).get("enable"):
        return False
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        return False
    return not config.get("sequence_batching")


def _nbytes(data: Any) -> int:
    return data.nbytes if isinstance(data, memoryview) else memoryview(data).nbytes


def _params_text(params: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    kept = {k: v for k, v in params.items() if k not in skip and not k.startswith("shared_memory_")}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str) if kept else ""


def request_key(generation: int, request: InferRequest) -> bytes | None:
    """The request's cache key, or None when the request must not be cached (sequence requests)."""
    if request.correlation_id or request.flags:
        return None
    h = hashlib.blake2b(digest_size=32)
    # every variable-length field is length-prefixed, so distinct requests never encode alike
    head = [request.model_name, str(generation)]
    for t in sorted(request.inputs, key=lambda t: t.name):
        head += [t.name, t.datatype, ",".join(map(str, t.shape)), str(_nbytes(t.data)),
                 _params_text(t.parameters, _TRANSPORT_PARAMS)]
    head.append("outputs")
    for o in sorted(request.outputs, key=lambda o: o.name):
        head += [o.name, _params_text(o.parameters, _TRANSPORT_PARAMS)]
    head += ["parameters", _params_text(request.parameters)]
    for field in head:
        encoded = field.encode("utf-8", "surrogatepass")
        h.update(len(encoded).to_bytes(8, "little"))
        h.update(encoded)
    for t in sorted(request.inputs, key=lambda t: t.name):
        h.update(t.data)
    return h.digest()


class _Entry:
    __slots__ = ("outputs", "parameters", "size")

    def __init__(self, outputs: list[Tensor], parameters: dict[str, Any], size: int) -> None:
        self.outputs = outputs
        self.parameters = parameters
        self.size = size


class ResponseCache:
    """Bounded LRU of successful responses by key; everything runs on the supervisor's event loop."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        # server-wide figures (the per-model ones live in each model's statistics)
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insertion_ns = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes, model_name: str, model_version: str, request_id: str) -> InferResponse | None:
        """A fresh response built over the cached bytes, or None on a miss."""
        start = time.monotonic_ns()
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            self.lookup_ns += time.monotonic_ns() - start
            return None
        self._entries.move_to_end(key)
        outputs = [Tensor(t.name, t.datatype, list(t.shape), t.data, dict(t.parameters)) for t in entry.outputs]
        response = InferResponse(model_name, model_version, request_id, outputs, dict(entry.parameters))
        self.hits += 1
        self.lookup_ns += time.monotonic_ns() - start
        return response

    def insert(self, key: bytes, response: InferResponse) -> bool:
        """Keep a copy of a successful response; False when it is larger than the whole cache."""
        start = time.monotonic_ns()
        try:
            return self._insert(key, response)
        finally:
            self.insertion_ns += time.monotonic_ns() - start

    def _insert(self, key: bytes, response: InferResponse) -> bool:
        size = ENTRY_OVERHEAD + sum(TENSOR_OVERHEAD + _nbytes(t.data) for t in response.outputs)
        if size > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used_bytes -= old.size
        while self._entries and self.used_bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.size
            self.evictions += 1
        outputs = [Tensor(t.name, t.datatype, list(t.shape), bytes(t.data), dict(t.parameters))
                   for t in response.outputs]
        self._entries[key] = _Entry(outputs, dict(response.parameters), size)
        self.used_bytes += size
        return True

    def utilization(self) -> float:
        return self.used_bytes / self.max_bytes if self.max_bytes > 0 else 0.0

    def clear(self) -> None:
        self._entries.clear()
        self.used_bytes = 0


async def infer_cached(cache: ResponseCache, mv: Any, request: InferRequest) -> InferResponse:
    """`request` to model version `mv` (core.models.ModelVersion) through the cache: a hit never reaches the
    scheduler; a miss runs and keeps a copy of its success (triton.md §6.7)."""
    start = time.monotonic_ns()
    key = request_key(mv.cache_generation, request)
    if key is None or request.device_outputs or any(t.device_ref is not None for t in request.inputs):
        # a sequence request, or device tensors (their bytes are not here to key or keep)
        return await mv.scheduler.submit(request)
    response = cache.lookup(key, mv.name, str(mv.version), request.id)
    lookup_ns = time.monotonic_ns() - start
    if response is not None:
        items = 1
        if int(mv.config.get("max_batch_size") or 0) > 0 and request.inputs and request.inputs[0].shape:
            items = max(1, request.inputs[0].shape[0])
        mv.stats.record_cache_hit(lookup_ns, request_ns=start + lookup_ns - request.arrival_ns,
                                  queue_ns=start - request.arrival_ns, batch_items=items)
        return response
    try:
        response = await mv.scheduler.submit(request)
    except BaseException:
        mv.stats.record_cache_miss(lookup_ns)
        raise
    insert_start = time.monotonic_ns()
    cache.insert(key, response)
    mv.stats.record_cache_miss(lookup_ns + time.monotonic_ns() - insert_start)
    return response
