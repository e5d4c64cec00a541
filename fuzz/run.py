#!/usr/bin/env python3
"""Run the fuzz targets in fuzz/targets/ (see fuzz/README.md).

    python fuzz/run.py [--seconds 60] [--runs N] [--json] [targets...]   coverage-guided (atheris/libFuzzer)
    python fuzz/run.py --replay [targets...]                              every kept corpus file, once
    python fuzz/run.py --replay TARGET --input FILE...                    reproduce a finding

Each target runs in its own process under atheris: the inferd modules it imports are instrumented, its
corpus grows in fuzz/work/<target>/ (kept between runs, so a campaign resumes) seeded by the kept corpus
fuzz/corpus/<target>/, and findings (crashes, hangs, memory blow-ups) land in fuzz/findings/<target>/.
After a finding the target starts again for the time left, until the same failure comes back. Without
atheris it falls back to harness.mutation_loop (random mutations of the corpus, no coverage) and says so.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

try:
    import atheris  # noqa: F401
    HAVE_ATHERIS = True
except ImportError:
    HAVE_ATHERIS = False

_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)(?: corp: (\d+)/)?")
_DONE = re.compile(r"^Done (\d+) runs in (\d+) second")
_UNITS = re.compile(r"^stat::number_of_executed_units: (\d+)")
_WRITTEN = re.compile(r"Test unit written to (\S+)")


@dataclass
class Report:
    target: str
    engine: str
    seconds: float = 0.0
    executions: int = 0
    cov: int | None = None  # libFuzzer's covered edges (instrumented Python branches) at the end
    ft: int | None = None  # libFuzzer's features (edges with hit-count buckets)
    corpus: int | None = None
    findings: list[str] = field(default_factory=list)  # saved inputs
    signatures: list[str] = field(default_factory=list)  # the distinct failures, one line each
    note: str = ""

    @property
    def exec_per_s(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        cov = "n/a" if self.cov is None else f"cov {self.cov} ft {self.ft}"
        corp = "" if self.corpus is None else f"  corpus {self.corpus}"
        out = (f"{self.target:<22} {self.engine:<8} {self.seconds:7.1f} s {self.executions:>11,} execs "
               f"({self.exec_per_s:,.0f}/s)  {cov}{corp}  findings {len(self.signatures)}")
        for sig, path in zip(self.signatures, self.findings):
            out += f"\n    {sig}\n      {path}"
        if self.note:
            out += f"\n    note: {self.note}"
        return out


def _instrument_prefixes(name: str) -> list[str]:
    """The target's INSTRUMENT literal, read without importing it (it must be set before the import)."""
    tree = ast.parse((harness.TARGETS_DIR / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "INSTRUMENT" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return ["inferd"]


def child(name: str, lf_args: list[str]) -> None:
    """In the target's own process: instrument, load, hand to libFuzzer (which exits the process)."""
    import atheris

    with atheris.instrument_imports(include=_instrument_prefixes(name)):
        mod = harness.load(name)
    if not any(a.startswith("-max_len=") for a in lf_args):
        lf_args.append(f"-max_len={int(getattr(mod, 'MAX_LEN', harness.DEFAULT_MAX_LEN))}")
    tokens = list(getattr(mod, "DICT", ()))
    if tokens and not any(a.startswith("-dict=") for a in lf_args):
        path = harness.WORK_DIR / f"{name}.dict"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join('"%s"\n' % "".join(f"\\x{b:02x}" for b in t) for t in tokens))
        lf_args.append(f"-dict={path}")
    # libFuzzer runs argv[0] again for -merge (and -fork): a script that re-enters this child mode
    again = harness.WORK_DIR / f"{name}.child.sh"
    again.parent.mkdir(parents=True, exist_ok=True)
    again.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" --child {name} -- "$@"\n')
    again.chmod(0o755)
    atheris.Setup([str(again), *lf_args], mod.test_one_input)
    atheris.Fuzz()


def _libfuzzer(name: str, lf_args: list[str], log: Path, verbose: bool) -> tuple[int, list[str]]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--", *lf_args]
    lines: list[str] = []
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            lines.append(line.rstrip("\n"))
            if verbose:
                print(line, end="", file=sys.stderr)
    return proc.wait(), lines


def _signature(lines: list[str]) -> str:
    """One line naming the failure in libFuzzer's output: the Python exception and its innermost frame,
    or libFuzzer's own verdict (timeout, out-of-memory, signal)."""
    for i, line in enumerate(lines):
        if "Uncaught Python exception" in line:
            tb = []
            for ln in lines[i + 1:]:
                if ln.startswith("==") or ln.startswith("MS:"):
                    break
                tb.append(ln)
            return harness.Failure("", "", "\n".join(tb)).signature
    for line in lines:
        for mark in ("ERROR: libFuzzer: timeout", "ERROR: libFuzzer: out-of-memory", "ERROR: libFuzzer: deadly",
                     "ERROR: libFuzzer:"):
            if mark in line:
                return line.split("ERROR: ", 1)[1].strip()
    return "unknown failure (see the log)"


def fuzz_atheris(name: str, args: argparse.Namespace) -> Report:
    rep = Report(name, "atheris")
    work = harness.WORK_DIR / name
    if args.fresh and work.is_dir():
        for p in work.iterdir():
            p.unlink()
    work.mkdir(parents=True, exist_ok=True)
    kept = harness.CORPUS_DIR / name
    kept.mkdir(parents=True, exist_ok=True)
    findings = harness.FINDINGS_DIR / name
    findings.mkdir(parents=True, exist_ok=True)
    log = harness.WORK_DIR / f"{name}.log"
    log.write_text("")
    start = time.monotonic()
    while True:
        left = args.seconds - (time.monotonic() - start)
        left_runs = args.runs - rep.executions if args.runs else 0
        if left < 1 or (args.runs and left_runs <= 0):
            break
        lf = [str(work), str(kept), f"-max_total_time={int(left)}", f"-rss_limit_mb={args.rss_limit_mb}",
              f"-timeout={args.timeout}", f"-artifact_prefix={findings}/", "-print_final_stats=1"]
        if left_runs:
            lf.append(f"-runs={left_runs}")
        if args.max_len:
            lf.append(f"-max_len={args.max_len}")
        rc, lines = _libfuzzer(name, lf, log, args.verbose)
        units = done = status_execs = 0
        for line in lines:
            if m := _STATUS.match(line):
                status_execs = int(m.group(1))
                rep.cov, rep.ft = int(m.group(2)), int(m.group(3))
                if m.group(4):
                    rep.corpus = int(m.group(4))
            elif m := _UNITS.match(line):
                units = int(m.group(1))
            elif m := _DONE.match(line):
                done = int(m.group(1))
        rep.executions += units or done or status_execs
        written = [m.group(1) for line in lines if (m := _WRITTEN.search(line))]
        if rc == 0 and not written:
            break
        sig = _signature(lines)
        if not written and rc != 0:
            rep.note = f"libFuzzer exited {rc} without saving an input (see {log})"
            break
        if sig in rep.signatures:
            break  # it would keep finding the same failure
        rep.signatures.append(sig)
        rep.findings.append(written[-1])
    rep.seconds = time.monotonic() - start
    if args.merge and rep.executions:
        merge(name, args)
    return rep


def merge(name: str, args: argparse.Namespace) -> int:
    """Add to the kept corpus the inputs of fuzz/work/<name>/ that reach new coverage."""
    return _merge_into_kept(name, harness.WORK_DIR / name, args.rss_limit_mb, args.verbose)


def _merge_into_kept(name: str, source: Path, rss_limit_mb: int = 2048, verbose: bool = False) -> int:
    """libFuzzer -merge=1: the inputs of `source` that reach coverage the kept corpus lacks join it, renamed to
    the hash convention; nothing kept is removed. How many were added."""
    kept = harness.CORPUS_DIR / name
    kept.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in kept.iterdir()}
    _libfuzzer(name, ["-merge=1", f"-rss_limit_mb={rss_limit_mb}", str(kept), str(source)],
               harness.WORK_DIR / f"{name}.log", verbose)
    added = 0
    for p in kept.iterdir():
        if p.name not in before and re.fullmatch(r"[0-9a-f]{40}", p.name):
            data = p.read_bytes()
            p.unlink()
            if harness.content_name(data) not in before:
                harness.save_input(kept, data)
                added += 1
    return added


def add_seeds(name: str, seeds: list[bytes]) -> int:
    """Seed candidates (fuzz/seeds/*.py) into the kept corpus: with atheris only those adding coverage,
    else every new one. How many were added."""
    if not HAVE_ATHERIS:
        kept = harness.CORPUS_DIR / name
        new = [s for s in seeds if not (kept / harness.content_name(s)).exists()]
        for s in new:
            harness.save_input(kept, s)
        return len(new)
    harness.WORK_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=harness.WORK_DIR) as tmp:
        for s in seeds:
            harness.save_input(Path(tmp), s)
        return _merge_into_kept(name, Path(tmp))


def fuzz_fallback(name: str, args: argparse.Namespace) -> Report:
    findings = harness.FINDINGS_DIR / name
    rep = Report(name, "mutate", note="atheris is not installed for this Python: random mutations of the "
                                      "corpus, without coverage guidance")

    def save(failure: harness.Failure) -> None:
        path = harness.save_input(findings, failure.data, "crash-")
        path.with_suffix(".txt").write_text(failure.error)
        rep.findings.append(str(path))
        rep.signatures.append(failure.signature)

    res = harness.mutation_loop(name, seconds=args.seconds, runs=args.runs, seed=args.seed, timeout=args.timeout,
                                max_failures=5, on_failure=save)
    rep.seconds, rep.executions = res.seconds, res.executions
    return rep


def do_replay(names: list[str], args: argparse.Namespace) -> int:
    failed = 0
    reports = []
    for name in names:
        files = [Path(p) for p in args.input] if args.input else None
        start = time.monotonic()
        count, failures = harness.replay(name, files, timeout=args.timeout)
        took = time.monotonic() - start
        reports.append({"target": name, "inputs": count, "seconds": round(took, 3),
                        "failures": [{"file": f.source, "signature": f.signature, "error": f.error}
                                     for f in failures]})
        failed += len(failures)
        if not args.json:
            print(f"{name:<22} {count:>5} inputs in {took:6.2f} s  failures {len(failures)}")
            for f in failures:
                print(f"  {f.source}\n" + "".join(f"    {ln}\n" for ln in f.error.rstrip().splitlines()))
    if args.json:
        print(json.dumps(reports, indent=2))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", help="target names (default: every fuzz/targets/*.py)")
    ap.add_argument("--seconds", type=float, default=60.0, help="time per target (default 60)")
    ap.add_argument("--runs", type=int, default=0, help="stop a target after this many executions (0: no limit)")
    ap.add_argument("--list", action="store_true", help="name each target and what it checks")
    ap.add_argument("--replay", action="store_true", help="run each target once on every kept corpus file")
    ap.add_argument("--input", action="append", default=[], help="with --replay: these files instead")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take (a hang beyond)")
    ap.add_argument("--rss-limit-mb", type=int, default=2048, help="memory a target process may use")
    ap.add_argument("--max-len", type=int, default=0, help="longest input (default: the target's MAX_LEN)")
    ap.add_argument("--merge", action="store_true", help="add inputs reaching new coverage to the kept corpus")
    ap.add_argument("--fresh", action="store_true", help="start from the kept corpus alone (empty fuzz/work/<t>)")
    ap.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    ap.add_argument("--seed", type=int, default=0, help="the mutation engine's random seed")
    ap.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once (one process each)")
    ap.add_argument("--verbose", action="store_true", help="show libFuzzer's output")
    args = ap.parse_args(argv)
    names = args.targets or harness.target_names()
    unknown = [n for n in names if n not in harness.target_names()]
    if unknown:
        ap.error(f"unknown targets {unknown}; there are {harness.target_names()}")
    if args.list:
        for name in names:
            doc = ast.get_docstring(ast.parse((harness.TARGETS_DIR / f"{name}.py").read_text())) or ""
            print(f"{name:<22} {' '.join(doc.split(chr(10) + chr(10))[0].split())}")
        return 0
    if args.replay:
        return do_replay(names, args)
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if HAVE_ATHERIS else "mutate"
    if engine == "atheris" and not HAVE_ATHERIS:
        ap.error("atheris is not installed for this Python (pip install atheris)")
    if engine == "mutate" and not args.json:
        print("atheris is not available: falling back to random mutations without coverage", file=sys.stderr)
    def one(name: str) -> Report:
        rep = fuzz_atheris(name, args) if engine == "atheris" else fuzz_fallback(name, args)
        if not args.json:
            print(rep.line(), flush=True)
        return rep

    if engine == "atheris" and args.jobs > 1:  # each target is its own process: threads only wait on them
        with ThreadPoolExecutor(args.jobs) as pool:
            reports = list(pool.map(one, names))
    else:
        reports = [one(name) for name in names]
    if args.json:
        print(json.dumps([{**asdict(r), "exec_per_s": round(r.exec_per_s, 1)} for r in reports], indent=2))
    return 1 if any(r.signatures for r in reports) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
