"""The core's side of the direct path (issue 42): frontend processes send the requests of simple models
straight to the models' workers, so those requests cost the core's event loop nothing.

- `eligible(mv)`: which loaded versions go direct. Everything the core must see per request keeps the
  core's path: ensembles, decoupled models, sequence batching (a sequence's requests must meet in one
  place), a queue bound the operator set (--max-queue-size; its default holds per frontend) or a queue
  policy (priorities, queue sizes, timeouts: one queue must see every request), the
  response cache, the rate limiter, instance recycling by request count, GPU instances (device outputs
  live in the core's device table). Dynamic batching goes direct when any requests may share a batch:
  each frontend forms batches of its own requests (direct_models.py) and the worker merges the batches
  queued for it.
- `section(dp)`: what the snapshot tells the frontends about them (snapshot.build adds it): per version
  (by its `serial`, unique per load) its config, the server-wide queue bound and pipeline depth, and per
  scheduled instance the identity of its worker while that worker is ready, else why its last one went.
- `Attacher`: tells every ready worker of a direct version to connect to every frontend's listener
  (wire message Attach), once per (worker, frontend) pair.
- `replay(dp, rows)`: the statistics a frontend recorded for its direct requests (stats_relay.py),
  applied to the versions' ModelStats here, so statistics and metrics stay the core's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..config import DEFAULT_MAX_QUEUE_SIZE
from ..core.dataplane_impl import ServerDataPlane
from ..core.models import READY, ModelVersion
from ..scheduler.batching import BatchRules
from ..scheduler.policy import PriorityPolicy

log = logging.getLogger("inferd.scaleout")

# StatsSink methods a frontend may relay (stats_relay.METHODS holds the same names, in this order)
METHODS = ("record_success", "record_successes", "record_failure", "record_execution")


def eligible(mv: ModelVersion, max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE) -> bool:
    """`max_queue_size`: the server-wide bound (--max-queue-size): one the operator set must be one queue's (its
    default, a memory guard, holds per frontend)."""
    cfg = mv.config
    if (mv.state != READY or mv.ensemble is not None or mv.decoupled or mv.cache_generation or mv.rate_gate is not None
            or "sequence_batching" in cfg or max_queue_size != DEFAULT_MAX_QUEUE_SIZE):
        return False
    if any(g.get("kind") == "KIND_GPU" for g in cfg.get("instance_group") or ()):
        return False
    if "dynamic_batching" in cfg and not _merges_anywhere(cfg):
        return False
    return not any(getattr(inst, "recycles_by_count", False) for inst in mv.instances)


def _merges_anywhere(cfg: dict[str, Any]) -> bool:
    """A dynamic batcher whose batches may form per frontend and merge in the worker: no priorities, queue sizes
    or timeouts (they need the one queue) and any requests may share a batch (no input whose shape or presence
    must agree; worker/message_loop.py merges under the same rule)."""
    if PriorityPolicy.from_dynamic_batching(cfg.get("dynamic_batching") or {}).holds_requests:
        return False
    rules = BatchRules.from_config(cfg)
    return not rules.must_match and not rules.has_optional


def _identity(inst: Any) -> str | None:
    worker = inst.worker if inst.ready else None
    return worker.identity if worker is not None else None


def _why_not(inst: Any) -> str:
    """Why a not-ready instance's worker went (a death's cause, as the core's own requests were told), or ""."""
    err = getattr(inst, "last_error", None) if not inst.ready else None
    return err.message if err is not None else ""


def section(dp: ServerDataPlane) -> dict[str, Any]:
    """{serial: {...}} for every direct version (snapshot.build puts it under "direct")."""
    settings = dp.manager.settings
    out: dict[str, Any] = {}
    for mv in dp.manager.loaded_versions():
        if not eligible(mv, settings.max_queue_size):
            continue
        out[str(mv.serial)] = {
            "name": mv.name, "version": str(mv.version), "config": mv.config,
            "max_queue": settings.max_queue_size, "depth": settings.timings.pipeline_depth,
            "instances": [[inst.name, _identity(inst), _why_not(inst)] for inst in mv.instances if not inst.passive]}
    return out


def serial_of(dp: ServerDataPlane, name: str, version: str) -> int | None:
    """The serial of the version a request for (name, version) resolves to, when that version goes direct."""
    try:
        mv = dp.resolve(name, version)
    except Exception:  # noqa: BLE001 - unknown or not loaded: the snapshot's entry says so already
        return None
    return mv.serial if eligible(mv, dp.manager.settings.max_queue_size) else None


class Attacher:
    """Which workers were told to connect to which frontend listener."""

    def __init__(self) -> None:
        self._told: set[tuple[str, str]] = set()

    def sync(self, dp: ServerDataPlane, endpoints: Iterable[str]) -> None:
        endpoints = [e for e in endpoints if e]
        live: set[tuple[str, str]] = set()
        for mv in dp.manager.loaded_versions():
            if not eligible(mv, dp.manager.settings.max_queue_size):
                continue
            for inst in mv.instances:
                worker = inst.worker if inst.ready and not inst.passive else None
                if worker is None:
                    continue
                for endpoint in endpoints:
                    pair = (worker.identity, endpoint)
                    live.add(pair)
                    if pair not in self._told:
                        worker.attach(endpoint)
        self._told = live  # pairs of gone workers or frontends are forgotten; a new one is told again


def inflight_table(doc: Any) -> dict[tuple[int, str], int]:
    """A frontend's in-flight counts {serial: {instance: n}} as {(serial, instance): n}."""
    table: dict[tuple[int, str], int] = {}
    if isinstance(doc, dict):
        for serial, counts in doc.items():
            if isinstance(counts, dict):
                for instance, n in counts.items():
                    if isinstance(n, int) and n > 0:
                        table[(int(serial), str(instance))] = n
    return table


def pending_table(doc: Any) -> dict[int, int]:
    """A frontend's queued counts {serial: n} with int keys."""
    if not isinstance(doc, dict):
        return {}
    return {int(serial): n for serial, n in doc.items() if isinstance(n, int) and n > 0}


def replay(dp: ServerDataPlane, rows: list[Any]) -> None:
    """Apply a frontend's relayed statistics rows: [serial, method index, args...]."""
    by_serial = {mv.serial: mv for mv in dp.manager.loaded_versions()}
    for row in rows:
        mv = by_serial.get(row[0])
        if mv is None:  # unloaded since: its figures went with it, as the core's own would
            continue
        try:
            getattr(mv.stats, METHODS[row[1]])(*row[2:])
        except Exception:  # a malformed row is a frontend bug: logged, never fatal to the core
            log.exception("bad statistics row from a frontend process: %r", row[:2])
