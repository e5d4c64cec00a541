"""Triton's nv_gpu_* gauges and nv_energy_consumption, read from NVML every --metrics-interval-ms.

NVML calls block in C (a slow or wedged driver can take seconds), so they run on a thread of their
own, never on the event loop: the thread stores an immutable snapshot that each scrape renders. A
reading that fails is exported as 0, as Triton does, and logged once until it works again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..gpus import Gpu, Nvml, NvmlError
from .text_format import Family, encode, escape

log = logging.getLogger("inferd")


@dataclass(slots=True)
class GpuSample:
    """One GPU's NVML readings, in Triton's units."""

    uuid: str
    utilization: float  # 0..1
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_w: float
    power_limit_w: float
    energy_j: float  # since the server started


def render_gpu_metrics(samples: Sequence[GpuSample]) -> bytes:
    """Triton's per-GPU families (names, HELP texts and the gpu_uuid label as tritonserver 2.51 has them)."""
    if not samples:
        return b""
    rows: tuple[tuple[str, str, str, Callable[[GpuSample], float]], ...] = (
        ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", lambda s: s.utilization),
        ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", lambda s: s.memory_total_bytes),
        ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", lambda s: s.memory_used_bytes),
        ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", lambda s: s.power_usage_w),
        ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", lambda s: s.power_limit_w),
        ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started",
         lambda s: s.energy_j),
    )
    families = []
    for name, kind, help_text, value in rows:
        fam = Family(name, kind, help_text)
        for s in samples:
            fam.add(f'gpu_uuid="{escape(s.uuid)}"', value(s))
        families.append(fam)
    return encode(families)


class GpuMetrics:
    """The NVML poller: a thread reads every GPU each interval; `render()` gives the last readings' families."""

    def __init__(self, nvml: Nvml, gpus: Sequence[Gpu], interval_s: float) -> None:
        self._nvml = nvml
        self._gpus = [g for g in gpus if g.uuid]  # a GPU NVML cannot name has no gpu_uuid label
        self._interval_s = interval_s
        self._samples: tuple[GpuSample, ...] = ()
        self._last_energy_mj: dict[str, int] = {}
        self._energy_j: dict[str, float] = {}
        self._failing: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    @property
    def gpus(self) -> list[Gpu]:
        return list(self._gpus)

    def _read(self, gpu: Gpu, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            value = fn(*args)
        except NvmlError as exc:
            if (gpu.uuid, what) not in self._failing:
                self._failing.add((gpu.uuid, what))
                log.warning("GPU metrics: cannot read the %s of GPU %d (%s): exported as 0", what, gpu.cuda_id, exc)
            return None
        self._failing.discard((gpu.uuid, what))
        return value

    def poll_once(self) -> None:
        """Read every GPU once and publish the snapshot (on the poll thread; tests call it directly)."""
        samples = []
        nv = self._nvml
        for gpu in self._gpus:
            i = gpu.nvml_index
            util = self._read(gpu, "utilization", nv.utilization, i)
            memory = self._read(gpu, "memory", nv.memory, i)
            power = self._read(gpu, "power usage", nv.power_usage_mw, i)
            limit = self._read(gpu, "power limit", nv.power_limit_mw, i)
            energy = self._read(gpu, "energy consumption", nv.energy_mj, i)
            if energy is not None:  # joules since the server started; a driver reset starts a new base
                last = self._last_energy_mj.get(gpu.uuid)
                if last is not None and energy >= last:
                    self._energy_j[gpu.uuid] = self._energy_j.get(gpu.uuid, 0.0) + (energy - last) / 1000.0
                self._last_energy_mj[gpu.uuid] = energy
            total, used = memory if memory is not None else (0, 0)
            samples.append(GpuSample(
                uuid=gpu.uuid, utilization=(util or 0) / 100.0, memory_total_bytes=total, memory_used_bytes=used,
                power_usage_w=(power or 0) / 1000.0, power_limit_w=(limit or 0) / 1000.0,
                energy_j=self._energy_j.get(gpu.uuid, 0.0)))
        self._samples = tuple(samples)
        self.polls += 1

    def render(self) -> bytes:
        return render_gpu_metrics(self._samples)

    def _run(self) -> None:
        while True:
            try:
                self.poll_once()
            except Exception:  # a bug here must not end the thread: the next interval tries again
                log.exception("GPU metrics: polling failed")
            if self._stop.wait(self._interval_s):
                return

    def start(self) -> None:
        if self._gpus and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inferd-gpu-metrics", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop polling; False when the thread is still inside an NVML call after `timeout_s` (it is a
        daemon thread and does not hold up the exit)."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
