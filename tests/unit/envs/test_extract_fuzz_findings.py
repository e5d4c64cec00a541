"""What fuzz/targets/env_unpack.py found in the unpacker (supervisor/envs/extract.py); the input is in its corpus."""

from __future__ import annotations

import io
import tarfile

import pytest
from inferd.supervisor.envs.errors import EnvError
from inferd.supervisor.envs.extract import extract_safely


@pytest.mark.parametrize("name, linkname", [("a" * 120 + "\0b", ""), ("l", "x" * 120 + "\0y")])
def test_a_member_name_or_link_with_a_nul_byte_is_refused_as_a_load_error(tmp_path, name, linkname):
    """A PAX header may carry a NUL in a path: os.open raised ValueError ("embedded null byte"), which
    escaped the unpacker as an internal error instead of the load error naming the member."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        if linkname:
            info.type, info.linkname = tarfile.SYMTYPE, linkname
            tar.addfile(info)
        else:
            tar.addfile(info, io.BytesIO(b""))
    path = tmp_path / "env.tar"
    path.write_bytes(out.getvalue())
    (tmp_path / "dest").mkdir()
    with pytest.raises(EnvError, match="NUL byte"):
        extract_safely(str(path), str(tmp_path / "dest"))


def test_a_pax_record_length_beyond_any_index_is_refused_as_corrupt(tmp_path):
    """A PAX record whose length field is a 20-digit number: tarfile's parser raised OverflowError (not a
    TarError), which escaped the unpacker as an internal error (found by the env_unpack campaign, 2026-12-07;
    its inputs are in the corpus)."""
    record = b"99999999999999999999 path=x\n"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        header = tarfile.TarInfo("././@PaxHeader")
        header.type, header.size = tarfile.XHDTYPE, len(record)
        tar.addfile(header, io.BytesIO(record))
        tar.addfile(tarfile.TarInfo("x"), io.BytesIO(b""))
    path = tmp_path / "env.tar"
    path.write_bytes(out.getvalue())
    (tmp_path / "dest").mkdir()
    with pytest.raises(EnvError, match="corrupt or truncated"):
        extract_safely(str(path), str(tmp_path / "dest"))
