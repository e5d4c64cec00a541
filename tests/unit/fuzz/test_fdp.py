"""fuzz/targets/_fdp.py's pure-Python reader consumes bytes exactly as atheris's FuzzedDataProvider does, so
a finding replays the same with or without atheris."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "fuzz" / "targets"))
from _fdp import Provider  # noqa: E402

atheris = pytest.importorskip("atheris")

RANGES = [(0, 0), (0, 1), (0, 255), (0, 256), (10, 265), (-3, 3), (-100, 100), (0, 1000), (0, 65535),
          (0, 65536), (0, 2**24 - 1), (0, 2**32 - 1), (-2**31, 2**31 - 1), (0, 2**64 - 1), (-2**63, 2**63 - 1)]


def _calls(p: object, rng: random.Random) -> list[object]:
    out: list[object] = []
    for _ in range(rng.randint(0, 12)):
        op = rng.randrange(4)
        if op == 0:
            out.append(p.ConsumeBytes(rng.randint(0, 9)))  # type: ignore[attr-defined]
        elif op == 1:
            out.append(p.ConsumeBool())  # type: ignore[attr-defined]
        elif op == 2:
            out.append(p.ConsumeIntInRange(*rng.choice(RANGES)))  # type: ignore[attr-defined]
        else:
            out.append(p.PickValueInList(list(range(rng.randint(1, 300)))))  # type: ignore[attr-defined]
        out.append(p.remaining_bytes())  # type: ignore[attr-defined]
    return out


def test_the_python_reader_reads_what_atheris_reads() -> None:
    rng = random.Random(7)
    for case in range(3000):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
        seed = rng.random()
        ours = _calls(Provider(data), random.Random(seed))
        theirs = _calls(atheris.FuzzedDataProvider(data), random.Random(seed))
        assert ours == theirs, (case, data)


def test_refusals_match() -> None:
    with pytest.raises(RuntimeError):
        Provider(b"ab").ConsumeIntInRange(3, 1)
    with pytest.raises(IndexError):
        Provider(b"ab").PickValueInList([])
