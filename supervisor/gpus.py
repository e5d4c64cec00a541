"""GPU discovery at start-up through NVML, behind a small interface (`Nvml`) that GPU metrics read too.

Numbering. NVML numbers every GPU of the host in PCI bus order; CUDA numbers only the GPUs that
CUDA_VISIBLE_DEVICES lets it see, in the order that variable lists them. inferd uses CUDA's numbers
everywhere a user sees one (config.pbtxt `gpus`, `model_instance_device_id`, the device made current
in a worker): GPU k is the k-th entry of the server's CUDA_VISIBLE_DEVICES (an NVML index or a
`GPU-<uuid>` prefix, as CUDA reads it: the list ends at the first entry that names no GPU), or NVML's
k-th GPU when the variable is unset. Workers inherit CUDA_VISIBLE_DEVICES and are started with
CUDA_DEVICE_ORDER=PCI_BUS_ID (unless the server's environment sets it), so CUDA in a worker counts
the GPUs in the same order.

No nvidia-ml-py, no driver, NVML failing or no visible GPU: inferd serves on CPUs, as without a GPU.
NVML calls are blocking C calls: callers on the event loop run `discover` in a thread.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class NvmlError(Exception):
    """An NVML call failed (no library, no driver, a device lost, a query not supported...)."""


class Nvml(Protocol):
    """The NVML queries inferd makes; devices by NVML index. Every method may raise NvmlError."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str: ...
    def name(self, index: int) -> str: ...
    def memory(self, index: int) -> tuple[int, int]: ...  # (total, used) bytes
    def utilization(self, index: int) -> int: ...  # percent of time a kernel ran, 0..100
    def power_usage_mw(self, index: int) -> int: ...
    def power_limit_mw(self, index: int) -> int: ...
    def energy_mj(self, index: int) -> int: ...  # since the driver loaded


class PyNvml:
    """`Nvml` over nvidia-ml-py (import name `pynvml`, in the `gpu` extra)."""

    def __init__(self, module: Any) -> None:
        self._nv = module
        self._handles: dict[int, Any] = {}

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nv, fn)(*args)
        except self._nv.NVMLError as exc:
            raise NvmlError(f"{fn}: {exc}") from None

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return handle

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._handles.clear()
        self._call("nvmlShutdown")

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def uuid(self, index: int) -> str:
        return self._text(self._call("nvmlDeviceGetUUID", self._handle(index)))

    def name(self, index: int) -> str:
        return self._text(self._call("nvmlDeviceGetName", self._handle(index)))

    def memory(self, index: int) -> tuple[int, int]:
        info = self._call("nvmlDeviceGetMemoryInfo", self._handle(index))
        return int(info.total), int(info.used)

    def utilization(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", self._handle(index)).gpu)

    def power_usage_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", self._handle(index)))

    def power_limit_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPowerManagementLimit", self._handle(index)))

    def energy_mj(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", self._handle(index)))


class FakeNvml:
    """TEST ONLY: `count` made-up GPUs whose readings change on every query, so that a server started
    with INFERD_TEST_ONLY_FAKE_GPUS (read in flags.py) can be tested for placement and GPU metrics on
    a host without a GPU. `fail_init`: NVML fails to start, as without a driver."""

    MEMORY_TOTAL = 16 << 30

    def __init__(self, count: int, fail_init: bool = False) -> None:
        self.count = count
        self.fail_init = fail_init
        self.reads = 0

    def init(self) -> None:
        if self.fail_init:
            raise NvmlError("nvmlInit: Driver Not Loaded (fake)")

    def shutdown(self) -> None:
        pass

    def device_count(self) -> int:
        return self.count

    def _check(self, index: int) -> None:
        if not 0 <= index < self.count:
            raise NvmlError(f"no GPU {index}")

    def uuid(self, index: int) -> str:
        self._check(index)
        return "GPU-fa6e0000-0000-0000-0000-%012d" % index

    def name(self, index: int) -> str:
        self._check(index)
        return "Fake GPU"

    def memory(self, index: int) -> tuple[int, int]:
        self._check(index)
        self.reads += 1
        return self.MEMORY_TOTAL, (self.reads * (1 << 20)) % self.MEMORY_TOTAL

    def utilization(self, index: int) -> int:
        self._check(index)
        self.reads += 1
        return self.reads % 101

    def power_usage_mw(self, index: int) -> int:
        self._check(index)
        return 50_000 + index * 1000

    def power_limit_mw(self, index: int) -> int:
        self._check(index)
        return 300_000

    def energy_mj(self, index: int) -> int:
        self._check(index)
        self.reads += 1
        return 1_000_000 + self.reads * 500


def nvml_factory(fake_spec: str = "", import_module: Callable[[str], Any] = importlib.import_module
                 ) -> Callable[[], Nvml]:
    """What `discover` calls for its NVML: pynvml, or (tests only) fakes per `fake_spec`: "<n>" GPUs, or
    "error" for an NVML that fails to start. The callable raises NvmlError when nvidia-ml-py is missing."""
    if fake_spec:
        fail = fake_spec.strip().lower() == "error"
        count = 0 if fail else int(fake_spec)
        return lambda: FakeNvml(count, fail_init=fail)

    def load() -> Nvml:
        try:
            module = import_module("pynvml")
        except ImportError:
            raise NvmlError("nvidia-ml-py is not installed (pip install 'inferd[gpu]')") from None
        return PyNvml(module)

    return load


@dataclass(frozen=True)
class Gpu:
    cuda_id: int  # the number config.pbtxt and the workers use
    nvml_index: int
    uuid: str  # "" when NVML could not read it (no metrics for that GPU)
    name: str
    memory_total_bytes: int = 0


@dataclass
class Discovery:
    """What start-up found: the GPUs models may use, and the NVML that found them (kept open for
    GPU metrics; None when there is none). `note` is the one start-up log line."""

    gpus: tuple[Gpu, ...] = ()
    nvml: Nvml | None = None
    note: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def cuda_ids(self) -> tuple[int, ...]:
        return tuple(g.cuda_id for g in self.gpus)

    def close(self) -> None:
        nvml, self.nvml = self.nvml, None
        if nvml is not None:
            try:
                nvml.shutdown()
            except NvmlError:
                pass


def _match(entry: str, uuids: Sequence[str]) -> int | None:
    """The NVML index a CUDA_VISIBLE_DEVICES entry names, as CUDA reads it; None when it names none."""
    if entry.isdigit():
        index = int(entry)
        return index if index < len(uuids) else None
    if not entry or entry.startswith("MIG-"):
        return None  # MIG instances are not GPUs NVML enumerates at top level
    prefix = entry if entry.startswith("GPU-") else "GPU-" + entry
    hits = [i for i, u in enumerate(uuids) if u and u.startswith(prefix)]
    return hits[0] if len(hits) == 1 else None


def visible_order(visible: str | None, uuids: Sequence[str]) -> tuple[list[int], str]:
    """NVML indices in CUDA's order under CUDA_VISIBLE_DEVICES=`visible` (None: unset), and a warning
    when an entry names no GPU (CUDA ignores it and every entry after it)."""
    if visible is None:
        return list(range(len(uuids))), ""
    order: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip()
        index = _match(entry, uuids)
        if index is None or index in order:
            if visible.strip():
                return order, (f"CUDA_VISIBLE_DEVICES={visible}: '{entry}' names no GPU NVML knows (or one "
                               "already listed); as CUDA does, inferd ignores it and the entries after it")
            return order, ""
        order.append(index)
    return order, ""


def discover(factory: Callable[[], Nvml], visible: str | None = None, device_order: str | None = None
             ) -> Discovery:
    """The GPUs this server may place instances on, numbered as CUDA does under CUDA_VISIBLE_DEVICES=
    `visible` (None: unset). Never raises: without NVML or GPUs, no GPUs."""
    try:
        nvml = factory()
    except NvmlError as exc:
        return Discovery(note=f"no GPUs: {exc}; models run on CPUs")
    try:
        nvml.init()
    except NvmlError as exc:
        return Discovery(note=f"no GPUs: NVML failed to start ({exc}; no NVIDIA driver?); models run on CPUs")
    try:
        count = nvml.device_count()
    except NvmlError as exc:
        count, failure = 0, f"NVML cannot count the GPUs ({exc})"
    else:
        failure = "NVML found no GPU"
    warnings: list[str] = []
    uuids: list[str] = []
    for index in range(count):
        try:
            uuids.append(nvml.uuid(index))
        except NvmlError as exc:
            uuids.append("")
            warnings.append(f"NVML cannot read GPU {index} ({exc}): it gets no GPU metrics")
    order, note = visible_order(visible, uuids)
    if note:
        warnings.append(note)
    gpus: list[Gpu] = []
    for cuda_id, index in enumerate(order):
        name, total = "unknown GPU", 0
        try:
            name = nvml.name(index)
            total = nvml.memory(index)[0]
        except NvmlError as exc:
            warnings.append(f"NVML cannot describe GPU {cuda_id} ({exc})")
        gpus.append(Gpu(cuda_id, index, uuids[index], name, total))
    if not gpus:
        if count and visible is not None:
            failure = f"CUDA_VISIBLE_DEVICES={visible!r} hides all {count} GPUs"
        Discovery(nvml=nvml).close()
        return Discovery(note=f"no GPUs: {failure}; models run on CPUs", warnings=warnings)
    if len(gpus) > 1 and device_order not in (None, "PCI_BUS_ID"):
        warnings.append(f"CUDA_DEVICE_ORDER={device_order}: CUDA may number the GPUs otherwise than NVML's PCI "
                        "bus order that inferd uses for `gpus` in config.pbtxt; unset it or set PCI_BUS_ID")
    listed = ", ".join(f"{g.cuda_id}: {g.name} {g.uuid} ({g.memory_total_bytes / (1 << 30):.0f} GiB)" for g in gpus)
    return Discovery(tuple(gpus), nvml, f"GPUs: {listed}", warnings)
