"""The environment unpacker (supervisor/envs/extract.py) on real crafted tarballs: hostile ones write
nothing outside the destination, ordinary ones come out as tarfile's `data` filter would extract them,
and the size and member caps refuse a tarball before anything is written."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from env_tarballs import chain_escape_members, sparse_tarball, tree, write_tar
from inferd.supervisor.envs import unpack
from inferd.supervisor.envs.unpack import EnvError


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """(dest, outside): a fresh extraction dir and a dir beside it holding a victim file."""
    dest = tmp_path / "cache" / ".tmp" / "x"
    dest.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("original\n")
    return dest, outside


def test_the_chain_tarball_defeats_lexical_checks_and_tarfiles_filter(tmp_path: Path,
                                                                        places: tuple[Path, Path]) -> None:
    """The attack is real on this Python: tarfile's `data` filter extracts it and writes outside (the gap
    CVE-2025-4517 closed in 3.11.13 / 3.12.11 / 3.13.4), as inferd's unpacker did before it wrote members
    itself."""
    dest, outside = places
    tarball = write_tar(tmp_path / "evil.tar.gz", chain_escape_members(dest, outside))
    with tarfile.open(tarball) as tar:
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            pytest.skip(f"this Python's tarfile filter is patched against CVE-2025-4517 ({exc})")
    assert (outside / "pwned").read_text() == "written outside\n"
    assert (outside / "victim").read_text() == "overwritten\n"


def test_symlink_chain_past_path_max_writes_nothing_outside(tmp_path: Path, places: tuple[Path, Path]) -> None:
    dest, outside = places
    tarball = write_tar(tmp_path / "evil.tar.gz", chain_escape_members(dest, outside))
    with pytest.raises(EnvError, match="is a symlink on disk"):
        unpack.extract_safely(str(tarball), str(dest))
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_text() == "original\n"


@pytest.mark.parametrize("members,words", [
    # a member whose parent is a symlink, even one pointing inside: nothing is ever written through a link
    ([("real", {"type": tarfile.DIRTYPE}), ("lib", {"type": tarfile.SYMTYPE, "linkname": "real"}),
      ("lib/x.py", {"data": b"x"})], "member 'lib/x.py': 'lib' is a symlink on disk"),
    ([("lib", {"type": tarfile.SYMTYPE, "linkname": "."}), ("lib", {"type": tarfile.DIRTYPE})],
     "member 'lib': 'lib' is a symlink on disk"),
    # hard links: only to a regular file extracted before, never through a link
    ([("sub/f", {"data": b"f"}), ("lnk", {"type": tarfile.SYMTYPE, "linkname": "sub"}),
      ("hl", {"type": tarfile.LNKTYPE, "linkname": "lnk/f"})], "hard link 'hl' -> 'lnk/f': 'lnk' is a symlink"),
    ([("hl", {"type": tarfile.LNKTYPE, "linkname": "later"}), ("later", {"data": b"x"})],
     "the target is not a regular file extracted before it"),
    ([("sub", {"type": tarfile.DIRTYPE}), ("hl", {"type": tarfile.LNKTYPE, "linkname": "sub"})],
     "the target is not a regular file extracted before it"),
    ([("ln", {"type": tarfile.SYMTYPE, "linkname": "sub/f"}), ("sub/f", {"data": b"f"}),
      ("hl", {"type": tarfile.LNKTYPE, "linkname": "ln"})], "the target is not a regular file"),
    # symlinks that resolve outside on disk (each looks inside by name), or loop
    ([("a", {"type": tarfile.SYMTYPE, "linkname": "b/.."}), ("b", {"type": tarfile.SYMTYPE, "linkname": "."}),
      ("c", {"type": tarfile.SYMTYPE, "linkname": "a/a/.."})], "resolves outside the environment"),
    ([("a", {"type": tarfile.SYMTYPE, "linkname": "b"}), ("b", {"type": tarfile.SYMTYPE, "linkname": "a"})],
     "through too many links"),
    # a later member may replace an earlier file or link, not a directory
    ([("sub/f", {"data": b"f"}), ("sub", {"data": b"x"})], "member 'sub' would replace a directory"),
], ids=["parent-symlink-inside", "dir-over-symlink", "hardlink-through-symlink", "hardlink-forward",
        "hardlink-to-dir", "hardlink-to-symlink", "symlink-resolves-outside", "symlink-loop", "file-over-dir"])
def test_hostile_members_are_refused(tmp_path: Path, places: tuple[Path, Path], members: list, words: str) -> None:
    dest, outside = places
    tarball = write_tar(tmp_path / "t.tar.gz", [("bin/python", {"data": b"", "mode": 0o755}), *members])
    with pytest.raises(EnvError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        unpack.extract_safely(str(tarball), str(dest))
    assert str(tarball) in str(err.value)
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_ordinary_tarball_comes_out_as_tarfiles_data_filter_extracts_it(tmp_path: Path) -> None:
    """Differential: files, modes, mtimes, relative and dangling symlinks, hard links, "./" prefixes,
    a member given twice (the later wins), GNU long names."""
    deep = "/".join(["pkg"] + ["sub%d" % i for i in range(30)]) + "/" + "m" * 200 + ".py"
    members = [
        (".", {"type": tarfile.DIRTYPE, "mode": 0o755}),
        ("./bin", {"type": tarfile.DIRTYPE, "mode": 0o755}),
        ("./bin/python3.10", {"data": b"#!/bin/sh\n", "mode": 0o755, "mtime": 1_600_000_000}),
        ("./bin/python", {"type": tarfile.SYMTYPE, "linkname": "python3.10"}),
        ("lib/libz.so.1.2", {"data": b"\x7fELF" + bytes(5000) + b"end", "mode": 0o4755, "mtime": 1_500_000_000}),
        ("lib/libz.so.1", {"type": tarfile.SYMTYPE, "linkname": "libz.so.1.2"}),
        # (tar writers give a hard link its file's mode and mtime; tarfile applies them to the inode again)
        ("lib/libz.so", {"type": tarfile.LNKTYPE, "linkname": "lib/libz.so.1.2", "mode": 0o4755,
                         "mtime": 1_500_000_000}),
        ("lib/python3.10/site.py", {"data": b"old", "mode": 0o664, "mtime": 1_700_000_000}),
        ("lib/python3.10/site.py", {"data": b"new", "mode": 0o444, "mtime": 1_700_000_001}),
        ("share/dangling", {"type": tarfile.SYMTYPE, "linkname": "../nowhere/yet"}),
        ("share/up", {"type": tarfile.SYMTYPE, "linkname": "../lib/./libz.so.1"}),
        ("ro", {"type": tarfile.DIRTYPE, "mode": 0o555}),
        ("ro/f", {"data": b"in a read-only dir"}),
        (deep, {"data": b"deep"}),
    ]
    tarball = write_tar(tmp_path / "ok.tar.gz", members)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    unpack.extract_safely(str(tarball), str(ours))
    with tarfile.open(tarball) as tar:
        tar.extractall(theirs, filter="data")
    got, want = tree(ours), tree(theirs)
    # directories: tarfile's data filter leaves them 0700 (mode ignored); ours keep the member's mode + u=rwx
    assert {k: v for k, v in got.items() if v[0] != "dir"} == {k: v for k, v in want.items() if v[0] != "dir"}
    assert sorted(k for k, v in got.items() if v[0] == "dir") == sorted(k for k, v in want.items() if v[0] == "dir")
    assert got["ro"] == ("dir", "0o755") and got["bin"] == ("dir", "0o755")
    assert got["lib/libz.so.1.2"][1] == "0o755" and got["lib/libz.so"][4] == 2  # setuid dropped; a real hard link
    assert got["lib/python3.10/site.py"][1:3] == ("0o644", b"new")


def test_sparse_member_stays_sparse_and_counts_its_full_size(tmp_path: Path) -> None:
    apparent = 256 << 20
    tarball = sparse_tarball(tmp_path, apparent)
    assert tarball.stat().st_size < 64 << 10
    dest = tmp_path / "d"
    dest.mkdir()
    unpack.extract_safely(str(tarball), str(dest))
    big = dest / "big.bin"
    assert big.stat().st_size == apparent and big.stat().st_blocks * 512 <= 2 << 20
    with open(big, "rb") as f:
        assert f.read(2) == b"x\0"
    small = tmp_path / "small"
    small.mkdir()
    with pytest.raises(EnvError, match=r"unpacks to more than 64.0 MiB, the most an environment may take "
                                       r"\(--env-unpack-max-gb\)"):
        unpack.extract_safely(str(tarball), str(small), unpack.Limits(max_bytes=64 << 20))
    assert list(small.iterdir()) == []


def test_a_small_tarball_expanding_past_the_cap_is_refused_before_writing(tmp_path: Path) -> None:
    """A bomb scaled down: 96 MiB of zeros in a ~100 KiB tarball, a 32 MiB cap. The headers say it all,
    so not one byte is written."""
    zeros = bytes(32 << 20)
    members = [("bin/python", {"data": b"", "mode": 0o755})]
    members += [("blob%d" % i, {"data": zeros}) for i in range(3)]
    tarball = write_tar(tmp_path / "bomb.tar.gz", members)
    assert tarball.stat().st_size < 1 << 20
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(EnvError, match="unpacks to more than 32.0 MiB"):
        unpack.extract_safely(str(tarball), str(dest), unpack.Limits(max_bytes=32 << 20))
    assert list(dest.iterdir()) == []
    unpack.extract_safely(str(tarball), str(dest), unpack.Limits(max_bytes=96 << 20))  # exactly at the cap: fine


def test_member_count_cap(tmp_path: Path) -> None:
    members = [("f%04d" % i, {"data": b""}) for i in range(1001)]
    tarball = write_tar(tmp_path / "many.tar.gz", members)
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(EnvError, match=r"has more than 1000 members, the most an environment may have "
                                       r"\(--env-unpack-max-files\)"):
        unpack.extract_safely(str(tarball), str(dest), unpack.Limits(max_members=1000))
    assert list(dest.iterdir()) == []
    unpack.extract_safely(str(tarball), str(dest), unpack.Limits(max_members=1001))
    assert len(os.listdir(dest)) == 1001


def test_tarball_larger_than_the_cap_is_not_read(tmp_path: Path) -> None:
    tarball = write_tar(tmp_path / "plain.tar", [("f", {"data": os.urandom(64 << 10)})], mode="w")
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(EnvError, match=r"plain.tar is 7\d.\d KiB, more than the 32.0 KiB an environment may "
                                       r"unpack to \(--env-unpack-max-gb\)"):
        unpack.extract_safely(str(tarball), str(dest), unpack.Limits(max_bytes=32 << 10))


def test_truncated_tarball_is_corrupt(tmp_path: Path) -> None:
    tarball = write_tar(tmp_path / "t.tar.gz", [("f", {"data": os.urandom(1 << 16)})])
    tarball.write_bytes(tarball.read_bytes()[:-4000])
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(EnvError, match="is corrupt or truncated"):
        unpack.extract_safely(str(tarball), str(dest))
