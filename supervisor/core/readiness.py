"""Model and server readiness where a Python model defines `is_ready()` (python_backend after Triton 2.51).

As the current Triton: a model version is ready when it is READY and every one of its instances' checks
says so (core TritonModel::IsReady asks each instance, python_backend's TRITONBACKEND_ModelInstanceReady
calls is_ready()); with --strict-readiness the server is ready only when every such model is, too
(InferenceServer::IsReady). inferd asks the instances at once rather than one after another, and only those
that are READY (an instance being restarted does not make a model unready in inferd). A model without
is_ready() is answered from its state, without asking any worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from inferd.worker.wire.errors import InferdError

from .models import READY, ModelVersion

log = logging.getLogger("inferd.core")


def _asked(mv: ModelVersion) -> list[Any]:
    """The version's READY instances whose model defines is_ready()."""
    return [i for i in mv.instances if i.ready and i.worker is not None and i.worker.readiness is not None]


def asks_model(mv: ModelVersion) -> bool:
    """Whether `mv`'s readiness comes from its model's is_ready() (else from its state alone)."""
    return any(i.worker is not None and i.worker.readiness is not None for i in mv.instances)


def _why_not(mv: ModelVersion) -> str:
    """Why a version is not ready; for a loaded one, Triton's words for an instance whose process is gone."""
    if mv.state == READY:
        down = next((i for i in mv.instances if not i.ready), None)
        if down is not None:
            return f"Stub process '{down.name}' is not healthy."
    return mv.reason or "no ready instance"


async def version_ready(mv: ModelVersion) -> tuple[bool, str]:
    """(ready, why not) of a version, asking its instances' is_ready() (each answers within 5 s)."""
    if not mv.ready:
        return False, _why_not(mv)
    asked = _asked(mv)
    if not asked:
        return True, ""
    answers = await asyncio.gather(*(i.worker.check_ready() for i in asked))
    for instance, (ready, why) in zip(asked, answers):
        if not ready:  # python_backend's words for a check that said False
            return False, why or f"Model '{instance.name}' is not ready (user-defined check failed)."
    return True, ""


async def model_ready(dp: Any, name: str, version: str) -> bool:
    """What /v2/models/<name>[/versions/<v>]/ready and ModelReady answer."""
    try:
        mv = dp.resolve(name, version)
    except InferdError:
        return False  # as Triton: an unknown model or version is simply not ready
    if not asks_model(mv):
        if not mv.ready and mv.state == READY:  # its instances are being restarted (Triton: a dead stub)
            log.debug("Model '%s' version %d is not ready: %s", name, mv.version, _why_not(mv))
        return bool(mv.ready)
    ready, why = await version_ready(mv)
    if not ready:
        log.debug("Model '%s' version %d is not ready: %s", name, mv.version, why)
    return ready


async def server_ready(dp: Any) -> bool:
    """/v2/health/ready: with --strict-readiness, every model defining is_ready() is asked too."""
    if not dp.ready():
        return False
    if not dp.strict_readiness:
        return True
    asked = [mv for mv in dp.manager.loaded_versions() if asks_model(mv)]
    if not asked:
        return True
    answers = await asyncio.gather(*(version_ready(mv) for mv in asked))
    for mv, (ready, why) in zip(asked, answers):
        if not ready:
            log.debug("Model '%s' version %d is in READY lifecycle state but failed runtime readiness check "
                      "during server readiness evaluation: %s", mv.name, mv.version, why)
            return False
    return True
