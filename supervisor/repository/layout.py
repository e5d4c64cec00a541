"""Model repository layout: which models exist, in which repository, with which version directories.

Pure filesystem reads, no parsing of configs (see config.py). Every model name that comes from a client is
validated by `validate_model_name` *before* any path is built from it, so a name can never reach outside
a repository root (reliability.md §3.3 A1).

Layout (triton.md §4.1): `<repo>/<model>/[config.pbtxt] [configs/<n>.pbtxt] <version>/...`. Versions are
the numeric subdirectory names; names with a leading zero are ignored except "0" itself (Triton 2.51 loads
a version "0" but ignores "010").
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from inferd.worker.wire.errors import InferdError, invalid_arg, not_found

CONFIG_FILENAME = "config.pbtxt"
CONFIGS_DIRNAME = "configs"
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config.pbtxt larger than this is refused, not read
MAX_NAME_BYTES = 255  # NAME_MAX on every filesystem we care about
_MAX_VERSION = 2**63 - 1

# Allow-list: letters, digits, '_', '.', '-' (dots allowed anywhere, e.g. "..my_model", "model..1",
# ".hidden"), but never exactly "." or "..". Anything else (separators, NUL, '%', spaces, backslash,
# non-ASCII) is refused before it is joined onto a path.
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_VERSION_RE = re.compile(r"(0|[1-9][0-9]*)")


def validate_model_name(name: object) -> str:
    """Return `name` if it is a safe model name, else raise INVALID_ARG ("invalid model name ...").

    Called on every route before any filesystem access; the message never echoes an overlong name in full.
    """
    if not isinstance(name, str):
        raise invalid_arg("invalid model name: expected a string")
    shown = name if len(name) <= 64 else name[:64] + "..."
    if not name or not name.strip():
        raise invalid_arg("invalid model name: empty")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise invalid_arg(f"invalid model name {shown!r}: longer than {MAX_NAME_BYTES} bytes")
    if name in (".", "..") or not _NAME_RE.fullmatch(name):
        raise invalid_arg(
            f"invalid model name {shown!r}: only letters, digits, '_', '.' and '-' are allowed, "
            "and not '.' or '..'"
        )
    return name


def _validate_config_name(name: str) -> str:
    if not name or name in (".", "..") or not _NAME_RE.fullmatch(name):
        raise invalid_arg(f"invalid model config name {name!r} (--model-config-name)")
    return name


@dataclass(frozen=True)
class ModelSource:
    """What the repository holds for one model, read at one moment."""

    name: str
    repo: str  # absolute repository root
    path: str  # absolute model directory (<repo>/<name>)
    versions: tuple[int, ...]  # version directories found, ascending
    config_path: str | None  # the config file that was read, None when there is none
    config_text: str | None  # its text, None when there is none (auto-complete must supply the config)
    fingerprint: str = ""  # changes when anything under the model directory changes (poll mode)

    def version_path(self, version: int) -> str:
        return os.path.join(self.path, str(int(version)))


@dataclass(frozen=True)
class RepositoryScan:
    """Every model name found in the repositories.

    `models`: loadable names (present in exactly one repository, name valid) -> repository root.
    `duplicates`: names present in more than one repository -> those roots (not loadable).
    `invalid`: directory names that fail `validate_model_name` -> reason (not loadable).
    """

    models: dict[str, str] = field(default_factory=dict)
    duplicates: dict[str, tuple[str, ...]] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)

    def all_names(self) -> list[str]:
        return sorted(set(self.models) | set(self.duplicates) | set(self.invalid))

    def error_for(self, name: str) -> InferdError | None:
        """The load error for `name` when it is known but not loadable, else None."""
        if name in self.duplicates:
            return duplicate_error(name, self.duplicates[name])
        if name in self.invalid:
            return invalid_arg(self.invalid[name])
        return None


def duplicate_error(name: str, repos: Sequence[str]) -> InferdError:
    return invalid_arg(
        f"model '{name}' is present in more than one model repository ({', '.join(repos)}); "
        "it cannot be loaded"
    )


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)  # follows symlinks, like Triton
    except OSError:
        return False


def _never_a_model(path: str) -> bool:
    """A directory with no config file, no configs/ and no version directory can never load (e.g.
    examples/python_api, scripts beside the models): left out of the scan instead of failing the start."""
    try:
        entries = os.listdir(path)
    except OSError:
        return False
    return not any(e == CONFIG_FILENAME or e == "configs" or _VERSION_RE.fullmatch(e) for e in entries)


def list_models(repositories: Iterable[str]) -> RepositoryScan:
    """Scan the repository roots: every subdirectory is a model name (hidden ones included), except
    those that can never be a model (`_never_a_model`)."""
    seen: dict[str, list[str]] = {}
    invalid: dict[str, str] = {}
    for repo in repositories:
        root = os.path.abspath(repo)
        try:
            entries = sorted(os.listdir(root))
        except OSError as e:
            raise invalid_arg(f"failed to read model repository '{root}': {e.strerror or e}") from e
        for entry in entries:
            if not _is_dir(os.path.join(root, entry)) or _never_a_model(os.path.join(root, entry)):
                continue
            try:
                validate_model_name(entry)
            except InferdError as e:
                invalid[entry] = e.message
                continue
            seen.setdefault(entry, []).append(root)
    scan = RepositoryScan(invalid=invalid)
    for name, roots in seen.items():
        if len(roots) == 1:
            scan.models[name] = roots[0]
        else:
            scan.duplicates[name] = tuple(roots)
    return scan


def find_versions(model_path: str) -> tuple[int, ...]:
    """Numeric subdirectory names of the model directory, ascending."""
    try:
        entries = os.listdir(model_path)
    except OSError:
        return ()
    versions = []
    for entry in entries:
        if not _VERSION_RE.fullmatch(entry):
            continue
        v = int(entry)
        if v > _MAX_VERSION or not _is_dir(os.path.join(model_path, entry)):
            continue
        versions.append(v)
    return tuple(sorted(versions))


def _read_config(path: str) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise invalid_arg(f"failed to read model configuration '{path}': {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise invalid_arg(f"model configuration '{path}' is not a regular file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise invalid_arg(
            f"model configuration '{path}' is {st.st_size} bytes, more than the {MAX_CONFIG_BYTES} allowed"
        )
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise invalid_arg(f"failed to read model configuration '{path}': {e.strerror or e}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_arg(f"model configuration '{path}' is not valid UTF-8 (byte {e.start})") from e


def fingerprint(model_path: str, max_entries: int = 100_000) -> str:
    """A digest of (relative path, size, mtime_ns) of everything under the model directory.

    Poll mode compares fingerprints between scans: any added, removed or touched file (config, labels,
    version content) changes it. Symlinked directories are not followed below the model directory.
    """
    h = hashlib.sha1()
    count = 0
    for dirpath, dirnames, filenames in os.walk(model_path):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, model_path)
        for name in sorted(filenames) + dirnames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            line = f"{os.path.join(rel_dir, name)}\0{st.st_size}\0{st.st_mtime_ns}\n"
            h.update(line.encode("utf-8", "surrogateescape"))
            count += 1
            if count >= max_entries:
                return h.hexdigest()
    return h.hexdigest()


def read_model(
    repo: str, name: str, model_config_name: str = "", with_fingerprint: bool = True
) -> ModelSource:
    """Read one model directory. INVALID_ARG for a bad name, NOT_FOUND when the directory is missing."""
    validate_model_name(name)
    root = os.path.abspath(repo)
    path = os.path.join(root, name)
    if not _is_dir(path):
        raise not_found(f"model '{name}' is not found in model repository '{root}'")
    config_path = None
    text = None
    if model_config_name:
        candidate = os.path.join(path, CONFIGS_DIRNAME, _validate_config_name(model_config_name) + ".pbtxt")
        text = _read_config(candidate)
        if text is not None:
            config_path = candidate
    if config_path is None:
        candidate = os.path.join(path, CONFIG_FILENAME)
        text = _read_config(candidate)
        if text is not None:
            config_path = candidate
    return ModelSource(
        name=name,
        repo=root,
        path=path,
        versions=find_versions(path),
        config_path=config_path,
        config_text=text,
        fingerprint=fingerprint(path) if with_fingerprint else "",
    )


def find_model(repositories: Sequence[str], name: str, model_config_name: str = "") -> ModelSource:
    """Locate and read model `name` across the repositories (explicit load, poll).

    INVALID_ARG for an invalid name (before any filesystem access) or a duplicate; NOT_FOUND when no
    repository holds it.
    """
    validate_model_name(name)
    roots = [os.path.abspath(r) for r in repositories]
    found = [r for r in roots if _is_dir(os.path.join(r, name))]
    if not found:
        raise not_found(f"failed to load '{name}', failed to poll from model repository: model not found")
    if len(found) > 1:
        raise duplicate_error(name, found)
    return read_model(found[0], name, model_config_name)


def scan_repositories(repositories: Sequence[str], model_config_name: str = "") -> tuple[
        RepositoryScan, dict[str, ModelSource | InferdError]]:
    """List every model and read each loadable one; a model that cannot be read maps to its error."""
    scan = list_models(repositories)
    sources: dict[str, ModelSource | InferdError] = {}
    for name, repo in sorted(scan.models.items()):
        try:
            sources[name] = read_model(repo, name, model_config_name)
        except InferdError as e:
            sources[name] = e
    return scan, sources
