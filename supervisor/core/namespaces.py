"""Model namespacing (`--model-namespacing=true`), as Triton: each model repository is a namespace, so a model
name may be in several repositories, each its own model.

The registry (models.ModelManager.entries) then keys every model "<repository>::<name>" (model names never hold
':'), while the model keeps its plain name everywhere a client sees it (responses, index rows, statistics).
A client names a model by its plain name: one model of that name is it; several are refused with Triton's
"There are <n> identifiers of model '<name>' in global map, model namespace must be provided to resolve
ambiguity.". An ensemble's step names "<its repository>::<model>": the model of that name in the ensemble's
own repository while one is loaded, else the one model of that name elsewhere (resolved at each call, so
models added or removed in poll mode are followed, as Triton's qa L0_model_namespacing expects).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..repository.layout import RepositoryScan

SEP = "::"


def key(namespace: str, name: str) -> str:
    return f"{namespace}{SEP}{name}"


def split(text: str) -> tuple[str, str]:
    """(namespace, name) of a key; ("", name) for a plain name."""
    namespace, sep, name = text.rpartition(SEP)
    return (namespace, name) if sep else ("", text)


def ambiguous(name: str, count: int) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, "There are %d identifiers of model '%s' in global map, model "
                       "namespace must be provided to resolve ambiguity." % (count, name))


def _known(entry: Any) -> bool:
    return bool(entry.versions or entry.records)


def pick(entries: Mapping[str, Any], text: str) -> Any | None:
    """The registry entry `text` names (a plain name or "<namespace>::<name>"; see the module docstring);
    None when there is none; InferdError when a plain name is ambiguous."""
    if SEP in text:  # an ensemble's step: its own repository's model while loaded, else a loaded one elsewhere
        own = entries.get(text)
        if own is not None and own.versions:
            return own
        name = split(text)[1]
        loaded = [e for k, e in entries.items() if k != text and split(k)[1] == name and e.versions]
        if len(loaded) > 1:
            raise ambiguous(name, len(loaded))
        return loaded[0] if loaded else own
    # the loaded ones count first: a model removed from its repository (poll mode) keeps only a record
    found = [e for k, e in entries.items() if split(k)[1] == text and e.versions]
    found = found or [e for k, e in entries.items() if split(k)[1] == text and _known(e)]
    if len(found) > 1:
        raise ambiguous(text, len(found))
    return found[0] if found else None


def keys_in(scan: RepositoryScan, name: str) -> list[str]:
    """The key of `name` in each repository that holds it."""
    roots = scan.duplicates.get(name) or ((scan.models[name],) if name in scan.models else ())
    return [key(root, name) for root in roots]


def all_keys(scan: RepositoryScan) -> list[str]:
    """Every model of the repositories, by key (a name in several repositories is several models)."""
    out = [key(root, name) for name, root in scan.models.items()]
    out += [key(root, name) for name, roots in scan.duplicates.items() for root in roots]
    return sorted(out)
