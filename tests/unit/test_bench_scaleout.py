"""bench/scaleout.py's scaling model (issue 42 item 2): requests/s predicted at C cores from the CPU µs per
request of each process class, capped by the core's serial ceiling for inferd and by cores only for Triton;
and the per-process CPU clock it reads (every thread of the process, none of its children)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import scaleout  # noqa: E402  (bench/ is not a package)


def test_inferd_is_capped_by_the_core_once_cores_outgrow_it():
    # 66 µs of core CPU per request: ceiling 1e6 / 66 = 15,152/s; 200 µs in all: 20,000/s at 4 cores
    pred = scaleout.predict({"core": 66.0, "frontends": 100.0, "workers": 34.0}, "core")
    assert pred["total_us"] == 200.0
    assert pred["serial_ceiling_per_s"] == 15152
    assert pred["worker_ceiling_per_instance_per_s"] == 29412
    assert pred["predicted_per_s"] == {"4": 15152, "16": 15152, "64": 15152}
    assert pred["bound_by"] == {"4": "core", "16": "core", "64": "core"}


def test_a_small_core_leaves_the_cores_as_the_bound_until_its_ceiling():
    # 10 µs of core: ceiling 100,000/s; 144 µs in all: 27,778/s at 4 cores, 111,111 at 16 -> capped
    pred = scaleout.predict({"core": 10.0, "frontends": 100.0, "workers": 34.0}, "core")
    assert pred["predicted_per_s"] == {"4": 27778, "16": 100000, "64": 100000}
    assert pred["bound_by"] == {"4": "cores", "16": "core", "64": "core"}


def test_triton_has_no_serial_ceiling():
    pred = scaleout.predict({"core": 80.0, "frontends": 0.0, "workers": 20.0}, scaleout.serial_class("triton"))
    assert pred["serial_ceiling_per_s"] is None
    assert pred["predicted_per_s"] == {"4": 40000, "16": 160000, "64": 640000}
    assert set(pred["bound_by"].values()) == {"cores"}


def test_the_table_takes_the_median_of_the_rounds_and_names_the_bound():
    def pt(rnd: int, server: str, core: float, **extra: str) -> dict:
        return {"round": rnd, "scenario": "http_add_sub", "server": server, "infer_per_s": 1.0,
                "cpu_us_per_request": {"core": core, "frontends": 100.0, "workers": 34.0}, **extra}

    points = [pt(1, "inferd-N2", 60.0), pt(2, "inferd-N2", 66.0), pt(3, "inferd-N2", 90.0),
              pt(4, "inferd-N2", 1.0, invalid="bad replies"),  # an invalid round counts for nothing
              pt(1, "triton", 80.0)]
    text, by = scaleout.model_table(points, ["inferd-N2", "triton", "inferd-N1"], 64)
    assert by["http_add_sub"]["inferd-N2"]["cpu_us_per_request"]["core"] == 66.0
    assert "inferd-N1" not in by["http_add_sub"]  # no measured round, no prediction
    rows = [line for line in text.splitlines() if line.startswith("| http_add_sub |")]
    assert rows[0] == ("| http_add_sub | inferd-N2 | 66.0 | 100.0 | 34.0 | 200.0 | 15,152 | 29,412 | "
                       "15,152 (core) | 15,152 (core) | 15,152 (core) |")
    assert rows[1] == ("| http_add_sub | triton | 80.0 | 100.0 | 34.0 | 214.0 | none (not serial) | 29,412 | "
                       "18,692 | 74,766 | 299,065 |")
    assert "the core stays one process" in text


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_process_clock_counts_every_thread_and_no_child():
    me = psutil.Process()
    before = scaleout.process_cpu_s(me)
    helper = threading.Thread(target=burn, args=(0.3,))
    helper.start()
    helper.join()  # an exited thread's CPU stays with the process
    assert scaleout.process_cpu_s(me) - before >= 0.3

    before = scaleout.process_cpu_s(me)
    child = subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                            "while time.process_time() < end: pass"], check=True)
    assert child.returncode == 0
    assert scaleout.process_cpu_s(me) - before < 0.25  # the child's 0.5 s is not ours


def test_an_unknown_server_name_is_refused_by_name(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["scaleout.py", "--servers", "inferd-Nx", "--no-record"])
    with pytest.raises(SystemExit):
        scaleout.main()
    assert "unknown server 'inferd-Nx'" in capsys.readouterr().err
