"""Regenerates the seed corpus of fuzz/targets/model_config.py: every config.pbtxt the repository ships.

    .venv/bin/python fuzz/seeds/config_seeds.py

Each config of examples/ and tests/fixtures/ (up to the target's MAX_LEN) becomes one seed: mode byte 0, then
the file's bytes. Files are named by the sha1 of their content (first 16 hex digits).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fuzz"))
import harness  # noqa: E402  (fuzz/harness.py: save_input)

MAX_LEN = 8192


def main() -> None:
    kept = 0
    for path in sorted([*ROOT.glob("examples/**/*.pbtxt"), *ROOT.glob("tests/fixtures/**/*.pbtxt")]):
        data = path.read_bytes()
        if len(data) < MAX_LEN:
            harness.save_input(ROOT / "fuzz" / "corpus" / "model_config", b"\x00" + data)
            kept += 1
    print(f"kept {kept} configs")


if __name__ == "__main__":
    main()
