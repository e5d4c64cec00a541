"""core/overrides.py: a load's `file:` parameters are checked before anything is written, every refusal is
INVALID_ARG naming the key, and a failed write leaves no directory behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from inferd.supervisor.core import overrides
from inferd.worker.wire.errors import ErrorCode, InferdError


@pytest.mark.parametrize("files,words", [
    ({"../x": b""}, "'file:../x' must be a relative path inside the model directory"),
    ({"1/../../x": b""}, "must be a relative path"),
    ({"/etc/passwd": b""}, "must be a relative path"),
    ({"": b""}, "must be a relative path"),
    ({".": b""}, "must be a relative path"),
    ({"1/\0": b""}, "must be a relative path"),
    ({"1/\ud800.py": b""}, "the path is not valid UTF-8"),
    ({"1/" + "é" * 128: b""}, "a file or directory name is longer than 255 bytes"),  # 256 bytes, 128 characters
    ({"1": b"", "1/model.py": b""}, "'file:1' and 'file:1/model.py' conflict: '1' cannot be both"),
    ({"1/a/b": b"", "1/a": b""}, "'file:1/a' and 'file:1/a/b' conflict: '1/a' cannot be both"),
    ({"1/model.py": b"", "./1/model.py": b""}, "'file:1/model.py' and 'file:./1/model.py' name the same file"),
])
def test_refusals_name_the_key(tmp_path: Path, files: dict[str, bytes], words: str) -> None:
    with pytest.raises(InferdError) as err:
        overrides.write(str(tmp_path), "m", files)
    assert err.value.code == ErrorCode.INVALID_ARG and words in err.value.message, err.value.message
    assert not (tmp_path / "overrides").exists() or list((tmp_path / "overrides").iterdir()) == []


def test_long_key_is_shortened_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(InferdError) as err:
        overrides.write(str(tmp_path), "m", {"1/" + "x" * 5000: b""})
    assert "'file:1/xxxx" in err.value.message and "...(5007 characters)'" in err.value.message
    assert len(err.value.message) < 300


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    deep = "/".join(["d" * 250] * 20)  # every name fits, the whole path does not
    with pytest.raises(InferdError) as err:
        overrides.write(str(tmp_path), "m", {"1/model.py": b"x", deep: b"y"})
    assert err.value.code == ErrorCode.INVALID_ARG and "cannot be written: File name too long" in err.value.message
    assert os.listdir(tmp_path / "overrides") == []


def test_written_and_discarded(tmp_path: Path) -> None:
    root = overrides.write(str(tmp_path), "m", {"1/model.py": b"code", "config.pbtxt": b"", "1/a//b/./c": b"c"})
    assert (Path(root) / "m" / "1" / "model.py").read_bytes() == b"code"
    assert (Path(root) / "m" / "1" / "a" / "b" / "c").read_bytes() == b"c"
    overrides.discard(root)
    overrides.discard(None)
    assert os.listdir(tmp_path / "overrides") == []
