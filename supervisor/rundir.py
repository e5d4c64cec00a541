"""The supervisor's run directory: the worker socket, the workers' Python path, config overrides.

Without --run-dir the supervisor makes a temp directory named after its pid and removes it when it
stops. One left behind by a supervisor killed with -9 is removed by the next supervisor to start,
as its shared memory is. A directory given with --run-dir belongs to the operator and stays.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile

from inferd.worker.wire import shm

log = logging.getLogger("inferd.rundir")

PREFIX = "inferd-run-"
_OURS = re.compile(re.escape(PREFIX) + r"(\d+)-[A-Za-z0-9_]+$")


def create() -> str:
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale(directory: str | None = None) -> list[str]:
    """Remove run directories of ours (this user's) whose supervisor has ended. Returns their paths."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _OURS.match(name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        path = os.path.join(directory, name)
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode):
            continue
        if shm.owner_gone(int(match.group(1)), st.st_mtime):
            remove(path)
            removed.append(path)
    if removed:
        log.info("removed %d run directories left by stopped supervisors", len(removed))
    return removed
