"""A load request's `file:<path>` parameters: checked, then written into a private model directory
under the run directory (<run dir>/overrides/load-XXXX/<model>/).

That directory lives exactly as long as the versions loaded from it: core/models.py removes it when
they are unloaded, when a reload replaced them (once the old workers stopped), and on every failed
load; a server that stops removes what is left. Every refusal is a client error naming the key.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Mapping

from inferd.worker.wire.errors import ErrorCode, InferdError

NAME_MAX = 255  # bytes in one path component (Linux filesystems)
PREFIX = "load-"
# a write that fails for these reasons is the request's fault, not the server's
_CLIENT_ERRNOS = (errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.EINVAL, errno.EILSEQ,
                  errno.ELOOP)


def _shown(key: str) -> str:
    return key if len(key) <= 120 else key[:100] + "...(%d characters)" % len(key)


def _invalid(message: str) -> InferdError:
    return InferdError(ErrorCode.INVALID_ARG, message)


def check(files: Mapping[str, bytes]) -> dict[str, tuple[str, bytes]]:
    """{normalised relative path: (key, bytes)}; INVALID_ARG naming the key for a path that leaves the
    model directory, a name no filesystem takes, or two keys that cannot both be written."""
    out: dict[str, tuple[str, bytes]] = {}
    for rel, data in files.items():
        key = "file:" + rel
        norm = os.path.normpath(rel) if rel else ""
        if (os.path.isabs(rel) or "\0" in rel or not norm or norm in (".", "..") or norm.startswith("../")):
            raise _invalid("file parameter '%s' must be a relative path inside the model directory" % _shown(key))
        try:
            encoded = os.fsencode(norm)
        except UnicodeError:
            raise _invalid("file parameter '%s': the path is not valid UTF-8" % _shown(key)) from None
        if any(len(part) > NAME_MAX for part in encoded.split(b"/")):
            raise _invalid("file parameter '%s': a file or directory name is longer than %d bytes"
                           % (_shown(key), NAME_MAX))
        if norm in out:
            raise _invalid("file parameters '%s' and '%s' name the same file" % (_shown(out[norm][0]), _shown(key)))
        out[norm] = (key, data)
    for norm, (key, _data) in out.items():  # 'file:1' and 'file:1/model.py': '1' cannot be a file and a dir
        parts = norm.split("/")
        for i in range(1, len(parts)):
            other = out.get("/".join(parts[:i]))
            if other is not None:
                raise _invalid("file parameters '%s' and '%s' conflict: '%s' cannot be both a file and a directory"
                               % (_shown(other[0]), _shown(key), "/".join(parts[:i])))
    return out


def _write_error(key: str, exc: OSError) -> InferdError:
    if exc.errno in _CLIENT_ERRNOS:
        return _invalid("file parameter '%s' cannot be written: %s" % (_shown(key), exc.strerror))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InferdError(ErrorCode.UNAVAILABLE, "file parameter '%s' cannot be written: %s"
                           % (_shown(key), exc.strerror))
    return InferdError(ErrorCode.INTERNAL, "file parameter '%s' cannot be written: %s" % (_shown(key), exc))


def write(run_dir: str, model: str, files: Mapping[str, bytes]) -> str:
    """Check `files`, then write them into a fresh override directory; returns its root (holding `model`/).
    Nothing is left behind when this raises."""
    checked = check(files)
    base = os.path.join(run_dir, "overrides")
    try:
        os.makedirs(base, exist_ok=True)
        root = tempfile.mkdtemp(prefix=PREFIX, dir=base)
    except OSError as exc:
        raise InferdError(ErrorCode.UNAVAILABLE if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ErrorCode.INTERNAL,
                          "cannot make a directory for the load's file parameters under %s: %s"
                          % (base, exc.strerror)) from None
    try:
        target = os.path.join(root, model)
        os.mkdir(target)
        for norm, (key, data) in checked.items():
            path = os.path.join(target, norm)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            except OSError as exc:
                raise _write_error(key, exc) from None
    except BaseException:
        discard(root)
        raise
    return root


def discard(root: str | None) -> None:
    """Remove an override directory (None: nothing to remove)."""
    if root:
        shutil.rmtree(root, ignore_errors=True)
