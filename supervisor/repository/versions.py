"""Version policy (triton.md §3.5, §4.4): which versions on disk to load, and which serves a request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg, not_found, unavailable


@dataclass(frozen=True)
class VersionSelection:
    """Versions to load (ascending) and the problems Triton only logs (missing specific versions)."""

    versions: tuple[int, ...]
    warnings: tuple[str, ...] = field(default=())


def select_versions(model_name: str, policy: mc.ModelVersionPolicy,
                    available: Iterable[int]) -> VersionSelection:
    """Apply the policy to the versions found on disk.

    - latest{n}: the n highest; all: every one; specific: the listed ones that exist.
    - A specific version without a directory is reported in `warnings` (Triton logs it and loads the rest).
    - Nothing selected: INVALID_ARG "at least one version must be available under the version policy ...".
    """
    on_disk = sorted(set(available))
    warnings: list[str] = []
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = on_disk
    elif choice == "specific":
        present = set(on_disk)
        chosen = []
        for v in sorted(set(policy.specific.versions)):
            if v in present:
                chosen.append(v)
            else:
                warnings.append(f"version {v} is specified for model '{model_name}', "
                                "but the version directory is not present")
    else:  # latest (also the default when no policy is set)
        n = policy.latest.num_versions if choice == "latest" else 1
        chosen = on_disk[len(on_disk) - n:] if n > 0 else []
    if not chosen:
        raise invalid_arg(
            f"at least one version must be available under the version policy of model '{model_name}'")
    return VersionSelection(tuple(chosen), tuple(warnings))


def parse_version(model_name: str, requested: str | int | None) -> int | None:
    """None for "" / None / -1 (the policy's default), else the version number; INVALID_ARG if malformed."""
    if requested is None or requested == "":
        return None
    if isinstance(requested, int) and not isinstance(requested, bool):
        v = requested
    elif isinstance(requested, str) and requested.lstrip("-").isdigit() and requested.isascii():
        v = int(requested)
    else:
        raise invalid_arg(
            f"failed to parse model version '{str(requested)[:64]}' of model '{model_name}': "
            "expected an integer")
    if v == -1:
        return None
    if v < 0 or v > 2**63 - 1:
        raise invalid_arg(f"invalid model version {v} of model '{model_name}'")
    return v


def resolve_version(model_name: str, requested: str | int | None, ready: Mapping[int, bool]) -> int:
    """The version a request for `requested` is served by.

    `ready` maps every loaded version (allowed by the policy) to whether it is READY.
    "" / None / -1 -> the highest READY version (UNAVAILABLE "... has no available versions" when none);
    an explicit version not loaded -> NOT_FOUND; loaded but not READY -> UNAVAILABLE.
    """
    v = parse_version(model_name, requested)
    if v is None:
        candidates = [ver for ver, ok in ready.items() if ok]
        if not candidates:
            raise unavailable(f"Request for unknown model: '{model_name}' has no available versions")
        return max(candidates)
    if v not in ready:
        raise not_found(f"Request for unknown model: '{model_name}' version {v} is not found")
    if not ready[v]:
        raise unavailable(f"Request for unknown model: '{model_name}' version {v} is not at ready state")
    return v


def unknown_model(model_name: str) -> InferdError:
    """The error for a model that is not loaded at all."""
    return InferdError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{model_name}' is not found")
