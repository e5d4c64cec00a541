"""Hostile EXECUTION_ENV_PATHs on a real server (issue 38 items 2 and 3): a FIFO and /dev/zero are refused at
once (they used to hold both environment threads for ever, so that no later environment ever loaded and the
server needed its whole drain time to stop), the CVE-2025-4517 symlink chain writes nothing outside the
cache, and a small tarball expanding past --env-unpack-max-gb is refused naming the cap."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from env_tarballs import chain_escape_members, write_tar

from .helpers import add_report_model, index, infer_info, wrapper_python_tarball

pytestmark = pytest.mark.inferd_only


def test_hostile_env_paths_fail_at_once_and_others_still_load(server_factory: Any, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("original\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    repo = tmp_path / "repo"
    repo.mkdir()
    add_report_model(repo, "fifo", fifo)
    add_report_model(repo, "zero", "/dev/zero")
    representative_dest = cache / ".tmp" / "01234567-abcdefgh"  # where the server extracts: for the lengths
    add_report_model(repo, "chain", write_tar(tmp_path / "chain.tar.gz", chain_escape_members(representative_dest,
                                                                                              outside)))
    zeros = bytes(8 << 20)
    add_report_model(repo, "bomb", write_tar(tmp_path / "bomb.tar.gz", [("bin/python", {"data": b"", "mode": 0o755})]
                                             + [("blob%d" % i, {"data": zeros}) for i in range(3)]))
    # an environment that works (a wrapper around this interpreter, which has numpy and pyzmq), loaded
    # only after the four above took the environment threads
    add_report_model(repo, "good", wrapper_python_tarball(tmp_path / "good.tar.gz", sys.executable))
    expected = {"fifo": f"EXECUTION_ENV_PATH {repo}/fifo/env.tar.gz is a FIFO: name a conda-pack tarball",
                "zero": f"EXECUTION_ENV_PATH {repo}/zero/env.tar.gz is a character device",
                "chain": "is a symlink on disk (nothing is written through a link)",
                "bomb": "unpacks to more than 16.0 MiB, the most an environment may take (--env-unpack-max-gb)"}
    server = server_factory(repo=repo, wait_ready=[], inferd_args=[
        "--env-cache-dir", str(cache), "--env-unpack-max-gb", str(16 / 1024)])
    rows = server.wait_until(lambda: (lambda r: r if all(r.get(n, {}).get("state") in ("READY", "UNAVAILABLE")
                                                         for n in [*expected, "good"]) else None)(index(server)),
                             60, "every model settled")
    for name, words in expected.items():
        assert rows[name]["state"] == "UNAVAILABLE" and words in rows[name]["reason"], (name, rows[name])
    assert rows["good"]["state"] == "READY", rows["good"]
    assert infer_info(server, "good")["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_text() == "original\n"
    assert list((cache / ".tmp").iterdir()) == []
    t0 = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - t0 < 4, "no environment thread may hold the stop (--exit-timeout-secs 5)"
