"""What fuzz/run.py and the CI replay (tests/unit/fuzz/test_fuzz_corpus.py) share: finding the targets,
loading one, replaying files through it, a pure-Python mutation loop (used when atheris is missing, and
for the brief seeded run in CI), and saving inputs under their content-hash names.

A target is fuzz/targets/<name>.py (names starting with `_` are helpers) defining
`test_one_input(data: bytes) -> None`, and optionally `setup()`, `MAX_LEN` (longest input the fuzzer
makes, default 4096), `DICT` (byte strings libFuzzer splices in) and `INSTRUMENT` (module prefixes whose
coverage guides atheris, default ("inferd",)). See fuzz/README.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

# INFERD_FUZZ_DIR: another tree of targets/ and corpus/ (the runner's own tests use one)
FUZZ_DIR = Path(os.environ.get("INFERD_FUZZ_DIR") or Path(__file__).resolve().parent)
TARGETS_DIR = FUZZ_DIR / "targets"
CORPUS_DIR = FUZZ_DIR / "corpus"
FINDINGS_DIR = FUZZ_DIR / "findings"  # gitignored: crashes, hangs and mismatches of local runs
WORK_DIR = FUZZ_DIR / "work"  # gitignored: the corpus a campaign grows, kept between runs
DEFAULT_MAX_LEN = 4096


def target_names() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.py") if not p.name.startswith("_"))


def load(name: str) -> ModuleType:
    """Import fuzz/targets/<name>.py (its helpers importable as top-level modules) and run its setup()."""
    path = TARGETS_DIR / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"no fuzz target {name!r}: {path} does not exist (targets: {', '.join(target_names())})")
    if str(TARGETS_DIR) not in sys.path:
        sys.path.insert(0, str(TARGETS_DIR))
    modname = f"fuzz_target_{name}"
    mod = sys.modules.get(modname)
    if mod is not None:
        return mod
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    if not callable(getattr(mod, "test_one_input", None)):
        raise SystemExit(f"fuzz target {path} defines no test_one_input(data: bytes)")
    setup = getattr(mod, "setup", None)
    if setup is not None:
        setup()
    return mod


def corpus_files(name: str) -> list[Path]:
    d = CORPUS_DIR / name
    return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")) if d.is_dir() else []


def content_name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def save_input(directory: Path, data: bytes, prefix: str = "") -> Path:
    """`data` under `directory`, named by its hash (an existing copy is kept as it is)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (prefix + content_name(data))
    if not path.exists():
        path.write_bytes(data)
    return path


@dataclass
class Failure:
    target: str
    source: str  # the corpus file, or "generated #n"
    error: str  # the traceback
    data: bytes = field(repr=False, default=b"")

    @property
    def signature(self) -> str:
        """Exception type and innermost frame: one bug found with different inputs reads the same."""
        lines = [ln for ln in self.error.strip().splitlines() if ln.strip()]
        frames = [ln.strip() for ln in lines if ln.strip().startswith('File "')]
        return f"{lines[-1].split(':', 1)[0] if lines else '?'} at {frames[-1] if frames else '?'}"


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang("input ran past the per-input time limit")


def run_one(fn: Callable[[bytes], None], data: bytes, timeout: float = 0.0) -> str | None:
    """The traceback of `fn(data)` failing (or running past `timeout` seconds, main thread only), else None."""
    armed = timeout > 0 and hasattr(signal, "setitimer")
    if armed:
        try:
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        except ValueError:  # not the main thread: no alarm (pytest-timeout still bounds the test)
            armed = False
    try:
        fn(data)
        return None
    except Exception:
        return traceback.format_exc()
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def replay(name: str, files: Iterable[Path] | None = None, timeout: float = 0.0) -> tuple[int, list[Failure]]:
    """Run target `name` on `files` (default: its kept corpus): (inputs run, failures)."""
    mod = load(name)
    paths = corpus_files(name) if files is None else list(files)
    failures = []
    for path in paths:
        data = path.read_bytes()
        err = run_one(mod.test_one_input, data, timeout)
        if err is not None:
            failures.append(Failure(name, str(path), err, data))
    return len(paths), failures


# ---------------------------------------------------------------- the pure-Python mutation loop

_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", b"0", b"-1", b"\r\n", b"\n", b"\r\n\r\n", b'"', b"{", b"[", b"]",
                b"}", b",", b":", b"1e999", b"18446744073709551616", b"\xc0\x80", b"\xed\xa0\x80"]


def mutate(data: bytes, rng: random.Random, pool: list[bytes], tokens: list[bytes], max_len: int) -> bytes:
    """1 to 4 random edits of `data`: bit flips, byte sets, inserted or deleted runs, a copied run, a
    splice with another corpus entry, a dictionary token."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[rng.randrange(len(buf))] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and buf:
            del buf[pos:pos + rng.randint(1, max(1, len(buf) // 4))]
        elif op == 4 and buf:
            start = rng.randrange(len(buf))
            run = buf[start:start + rng.randint(1, 64)]
            buf[pos:pos] = run * rng.randint(1, 4)
        elif op == 5 and pool:
            other = rng.choice(pool)
            cut = rng.randint(0, len(other))
            buf = buf[:pos] + bytearray(other[cut:])
        elif op == 6:
            buf[pos:pos] = rng.choice(tokens or _INTERESTING)
        else:
            buf[pos:pos] = rng.choice(_INTERESTING)
    return bytes(buf[:max_len])


@dataclass
class LoopResult:
    executions: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)


def mutation_loop(name: str, *, seconds: float = 0.0, runs: int = 0, seed: int = 0, timeout: float = 0.0,
                  max_failures: int = 1, on_failure: Callable[[Failure], None] | None = None) -> LoopResult:
    """Mutate target `name`'s corpus entries at random (seeded: the same inputs each time) until `seconds`
    pass or `runs` inputs ran; stops after `max_failures` distinct failures, or when one comes back."""
    mod = load(name)
    pool = [p.read_bytes() for p in corpus_files(name)] or [b""]
    tokens = list(getattr(mod, "DICT", ()))
    max_len = int(getattr(mod, "MAX_LEN", DEFAULT_MAX_LEN))
    rng = random.Random(seed)
    out = LoopResult()
    seen: set[str] = set()
    start = time.monotonic()
    deadline = start + seconds if seconds > 0 else float("inf")
    while (not runs or out.executions < runs) and time.monotonic() < deadline:
        data = mutate(rng.choice(pool), rng, pool, tokens, max_len)
        out.executions += 1
        err = run_one(mod.test_one_input, data, timeout)
        if err is None:
            continue
        failure = Failure(name, f"generated #{out.executions} (seed {seed})", err, data)
        if failure.signature in seen:
            break  # it would keep finding the same failure
        seen.add(failure.signature)
        out.failures.append(failure)
        if on_failure is not None:
            on_failure(failure)
        if len(out.failures) >= max_failures:
            break
    out.seconds = time.monotonic() - start
    return out
