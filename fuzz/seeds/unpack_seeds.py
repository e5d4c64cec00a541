"""Regenerates the seed corpus of fuzz/targets/env_unpack.py.

    .venv/bin/python fuzz/seeds/unpack_seeds.py [ENV.tar.gz]

- the member list of a real conda-pack environment (ENV.tar.gz, by default one the tests built and cached in
  ~/.cache/inferd-test/condapack/): every symlink, the interpreter, conda-unpack, conda-meta and a few
  package files, with their names, types, modes, times and link targets as packed and their contents
  emptied (a few KiB as a plain tar);
- hostile tarballs (gzip): the CVE-2025-4517 symlink chain of tests/env_tarballs.py aimed at the target's
  scratch directory, a hard link through it, absolute and '..' names, a FIFO and a device.
Mode byte 0, then the tarball. Files are named by the sha1 of their content (first 16 hex digits).
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fuzz"))
sys.path.insert(0, str(ROOT / "tests"))
import env_tarballs  # noqa: E402  (tests/env_tarballs.py: the hostile member lists)
import harness  # noqa: E402  (fuzz/harness.py: save_input)

OUT = ROOT / "fuzz" / "corpus" / "env_unpack"
KEEP = ("bin/python3.", "bin/conda-unpack", "conda-meta/history", "lib/python3.", "site-packages/numpy/__init__.py",
        "site-packages/zmq/__init__.py")


def conda_member_list(path: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(path) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as dst:
        kept = 0
        for member in src:
            wanted = member.issym() or member.islnk() or (
                any(member.name.startswith(k) or member.name.endswith(k) for k in KEEP) and kept < 12)
            if not wanted:
                continue
            info = tarfile.TarInfo(member.name)
            for attr in ("type", "mode", "mtime", "linkname", "uname", "gname"):
                setattr(info, attr, getattr(member, attr))
            info.size = 0
            dst.addfile(info, io.BytesIO(b"") if info.isreg() else None)
            kept += not (member.issym() or member.islnk())
    return _trimmed(out.getvalue())


def _trimmed(blob: bytes) -> bytes:
    """The archive without tarfile's padding to 10 KiB records: the members, then two zero blocks."""
    body = blob.rstrip(b"\0")
    body += bytes(-len(body) % 512)
    return body + bytes(1024)


def hostile() -> list[bytes]:
    def tar(members: list[env_tarballs.Member]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name, kw in members:
                env_tarballs.add(t, name, **kw)
        return gzip.compress(out.getvalue(), mtime=0)

    # the target unpacks into /parent/dest inside its scratch directory, with /parent/outside beside it
    chain = env_tarballs.chain_escape_members(Path("/parent/dest"), Path("/parent/outside"))
    return [
        tar(chain),
        tar([("bin/python", {"data": b""}), ("../victim.txt", {"data": b"x"})]),
        tar([("/parent/victim.txt", {"data": b"x"})]),
        tar([("l", {"type": tarfile.SYMTYPE, "linkname": "../outside"}), ("l/data", {"data": b"x"})]),
        tar([("h", {"type": tarfile.LNKTYPE, "linkname": "../victim.txt"})]),
        tar([("fifo", {"type": tarfile.FIFOTYPE}), ("null", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3})]),
    ]


def main() -> None:
    sources = sys.argv[1:] or sorted(glob.glob(os.path.expanduser("~/.cache/inferd-test/condapack/*/env.tar.gz")))
    for path in sources[:1]:
        harness.save_input(OUT, b"\x00" + conda_member_list(path))
        print(f"the member list of {path}")
    if not sources:
        print("no conda-pack tarball found (run tests/execenv once, or name one): hostile seeds only")
    for blob in hostile():
        harness.save_input(OUT, b"\x00" + blob)
    print(f"{len(list(OUT.iterdir()))} seeds in {OUT}")


if __name__ == "__main__":
    main()
