"""Two tritonserver flags inferd used to accept and ignore (issue 43 item 8), as Triton 2.51 runs them
(INFERD_E2E_TARGET=triton runs the same tests against it):

- --host-policy <name>,cpu-cores=<first>-<last> / numa-node=<n>: the worker (Triton: the Python stub) of an
  instance whose policy is <name> (its group's host_policy, else "cpu" for KIND_CPU) runs on those CPUs;
- --model-load-thread-count N: at most N models initialize at once.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "identity_fp32"
NODE0 = Path("/sys/devices/system/node/node0/cpulist")

# initialize() marks its start, then waits (bounded) for the other model's mark: whether it saw it says
# whether the two initialized at the same time
MEETS = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        marks, me, other = params["marks"], config["name"], params["other"]
        open(os.path.join(marks, me + ".started"), "w").close()
        deadline = time.monotonic() + float(params["wait_s"])
        seen = False
        while not seen and time.monotonic() < deadline:
            seen = os.path.exists(os.path.join(marks, other + ".started"))
            time.sleep(0.02)
        with open(os.path.join(marks, me + ".saw"), "w") as f:
            f.write("yes" if seen else "no")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''


def add_model(repo: Path, name: str, extra_config: str = "", model_py: str | None = None) -> None:
    shutil.copytree(EXAMPLE, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace('name: "identity_fp32"', f'name: "{name}"')
    if "instance_group" in extra_config:
        text = text.replace("instance_group [ { count: 1, kind: KIND_CPU } ]", "")
    config.write_text(text + "\n" + extra_config + "\n")
    if model_py is not None:
        (repo / name / "1" / "model.py").write_text(model_py)


def model_processes(server) -> list[psutil.Process]:
    """The processes running model instances: inferd's workers, Triton's Python stubs."""
    out = []
    for proc in psutil.Process(server.pid).children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "inferd.worker" in cmdline or "triton_python_backend_stub" in cmdline:
            out.append(proc)
    return out


def affinity_of(server, model: str) -> set[int]:
    """The CPUs of the one process serving `model`: an inferd worker (by /v2/inferd/status), a Triton
    Python stub (by the model path on its command line)."""
    if server.argv[0] == "bash":  # tests/tools/triton_reference.sh
        pids = [p.pid for p in model_processes(server) if f"/{model}/" in " ".join(p.cmdline())]
    else:
        pids = [i["pid"] for i in server.instances(model)]
    assert len(pids) == 1, (model, pids)
    return set(os.sched_getaffinity(pids[0]))


needs_two_cpus = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")


@needs_two_cpus
def test_cpu_cores_pin_the_workers_of_their_policy(server_factory, tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    add_model(repo, "by_kind")  # KIND_CPU: policy "cpu"
    add_model(repo, "by_group", 'instance_group [ { count: 1, kind: KIND_CPU, host_policy: "pinned" } ]')
    add_model(repo, "unnamed", 'instance_group [ { count: 1, kind: KIND_CPU, host_policy: "nobody" } ]')
    server = server_factory(repo=repo, models=["by_kind", "by_group", "unnamed"],
                            extra_args=["--host-policy", "cpu,cpu-cores=0-0", "--host-policy", "pinned,cpu-cores=1-1"])
    assert affinity_of(server, "by_kind") == {0}
    assert affinity_of(server, "by_group") == {1}
    assert affinity_of(server, "unnamed") == set(os.sched_getaffinity(0))  # no such policy: left alone


@pytest.mark.skipif(not NODE0.exists(), reason="no NUMA information in /sys")
def test_numa_node_runs_the_worker_on_the_nodes_cpus(server_factory, tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    add_model(repo, "on_node")
    server = server_factory(repo=repo, models=["on_node"], extra_args=["--host-policy", "cpu,numa-node=0"])
    cpus: set[int] = set()
    for part in NODE0.read_text().strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    assert affinity_of(server, "on_node") == cpus & set(os.sched_getaffinity(0))


def _meeting_repo(tmp_path: Path, wait_s: float) -> tuple[Path, Path]:
    repo, marks = tmp_path / "models", tmp_path / "marks"
    repo.mkdir()
    marks.mkdir()
    for me, other in (("first", "second"), ("second", "first")):
        params = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                         for k, v in (("marks", marks), ("other", other), ("wait_s", wait_s)))
        add_model(repo, me, params, MEETS)
    return repo, marks


def test_two_load_threads_initialize_two_models_at_once(server_factory, tmp_path):
    repo, marks = _meeting_repo(tmp_path, wait_s=60)
    server_factory(repo=repo, models=["first", "second"], extra_args=["--model-load-thread-count", "2"])
    assert {(marks / f"{m}.saw").read_text() for m in ("first", "second")} == {"yes"}


def test_one_load_thread_initializes_one_model_at_a_time(server_factory, tmp_path):
    repo, marks = _meeting_repo(tmp_path, wait_s=3)
    server_factory(repo=repo, models=["first", "second"], extra_args=["--model-load-thread-count", "1"])
    # the model that initialized first waited for the other in vain; the other found it done
    assert sorted((marks / f"{m}.saw").read_text() for m in ("first", "second")) == ["no", "yes"]
