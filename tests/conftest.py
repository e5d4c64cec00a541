"""Shared test harness: start a real server as a subprocess against a temporary model repository.

`server_factory` (one server per test) and `module_server_factory` (one per test module) build a
repository from fixture models (tests/fixtures/models) or example models (examples/), start
`inferd` on free 127.0.0.1 ports with test-profile timings, wait until it is live and the expected
models are ready, and stop it on teardown (SIGTERM, 10 s, then SIGKILL).

Environment knobs:
- INFERD_E2E_TARGET=triton runs the same tests against the real Triton (tests/tools/triton_reference.sh,
  or INFERD_TRITON_SCRIPT); tests marked `inferd_only` are skipped there. Default: inferd. A test may
  also start one server of each kind (`server_factory(..., target="triton")`).
- INFERD_E2E_FRONTEND_PROCESSES=N runs every inferd server with `--frontend-processes N` (frontend_processes/).
- INFERD_E2E_SKIP_MISSING=1 skips (instead of failing) server tests when the `inferd` console
  script is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is a dev dependency
    psutil = None  # type: ignore[assignment]

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_MODELS = REPO_ROOT / "tests" / "fixtures" / "models"
EXAMPLE_MODELS = REPO_ROOT / "examples"
INFERD_BIN = Path(sys.executable).parent / "inferd"
# the real Triton 2.51 (nvidia-pytriton wheel): `bash tests/tools/triton_reference.sh setup` once
TRITON_SCRIPT = Path(os.environ.get("INFERD_TRITON_SCRIPT", str(REPO_ROOT / "tests" / "tools" / "triton_reference.sh")))
TARGET = os.environ.get("INFERD_E2E_TARGET", "inferd").strip().lower()
FRONTEND_PROCESSES = os.environ.get("INFERD_E2E_FRONTEND_PROCESSES", "").strip()
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "inferd_"

START_DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.05
STOP_GRACE_S = 10.0

# Test-profile timings (reliability.md §4.1): fast heartbeats and restarts so supervision tests
# finish in seconds.
TEST_PROFILE_ARGS = [
    "--heartbeat-interval", "0.1",
    "--restart-base-delay", "0.1",
    "--restart-max-delay", "1",
]


def target_is_triton() -> bool:
    return TARGET == "triton"


# --------------------------------------------------------------------------------------------
# pytest hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: starts a server subprocess and talks to it with tritonclient")
    config.addinivalue_line(
        "markers", "inferd_only: uses an inferd-only feature (worker restarts, /v2/inferd/status); "
        "skipped when INFERD_E2E_TARGET=triton")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_inferd_only = pytest.mark.skip(reason="inferd-only behaviour; INFERD_E2E_TARGET=triton")
    for item in items:
        if "/tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
        if target_is_triton() and item.get_closest_marker("inferd_only"):
            item.add_marker(skip_inferd_only)


# --------------------------------------------------------------------------------------------
# small helpers


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = POLL_INTERVAL_S) -> Any:
    """Poll `predicate` until it returns a truthy value (returned) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # a poll may fail transiently (connection refused, ...)
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
        time.sleep(interval)


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET returning (status, body) for any status; raises only on connection errors."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post(url: str, body: bytes = b"", timeout: float = 10.0,
              headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def model_source(name: str) -> Path:
    """Directory of a fixture model (preferred) or an example model."""
    for base in (FIXTURE_MODELS, EXAMPLE_MODELS):
        candidate = base / name
        if candidate.is_dir():
            return candidate
    path = Path(name)
    if path.is_absolute() and path.is_dir():
        return path
    raise FileNotFoundError(f"no fixture or example model named {name!r}")


def example_model_names() -> list[str]:
    return sorted(p.name for p in EXAMPLE_MODELS.iterdir() if p.is_dir() and (p / "config.pbtxt").exists())


# --------------------------------------------------------------------------------------------
# leak checks


def shm_snapshot() -> dict[str, int]:
    """inferd's shared-memory regions that exist now, with their sizes: entries under /dev/shm whose name
    starts with `inferd_`, and the regions processes hold open by handle (unlinked at creation, they
    appear only as `/proc/<pid>/fd` links to `/dev/shm/inferd_... (deleted)`)."""
    out: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(SHM_DIR):
            if entry.name.startswith(SHM_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    out[entry.name] = entry.stat(follow_symlinks=False).st_size
    held = f"{SHM_DIR}/{SHM_PREFIX}"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(link)
                if target.startswith(held) and target.endswith(" (deleted)"):
                    out[target[len(f"{SHM_DIR}/"): -len(" (deleted)")]] = os.stat(link).st_size
            except OSError:
                continue
    return out


def shm_owner(name: str) -> int | None:
    """Owner pid encoded in an `inferd_<pid>_<suffix>` name, or None."""
    parts = name.split("_")
    if len(parts) >= 2 and parts[1].isdigit():
        return int(parts[1])
    return None


def leak_diff(before: dict[str, int], after: dict[str, int],
              owners: Iterable[int] | None = None) -> list[str]:
    """What `after` holds that `before` did not (restricted to entries owned by `owners` if given).

    Entries that vanished are not leaks. /dev/shm is shared with anything else running on the box,
    so pass `owners` (server and worker pids) where other inferd processes may be running.
    """
    owner_set = set(owners) if owners is not None else None
    problems = []
    for name, size in sorted(after.items()):
        if owner_set is not None and shm_owner(name) not in owner_set:
            continue
        if name not in before:
            problems.append(f"new /dev/shm entry {name} ({size} bytes)")
        elif before[name] != size:
            problems.append(f"/dev/shm entry {name} changed size {before[name]} -> {size}")
    return problems


def leak_free(before: dict[str, int], after: dict[str, int], owners: Iterable[int] | None = None) -> bool:
    """True when `after` has no shm entry that `before` lacked. Use with leak_diff for the message:
    `assert leak_free(b, a), leak_diff(b, a)`."""
    return not leak_diff(before, after, owners)


def pid_alive(pid: int) -> bool:
    """A zombie counts as dead."""
    if psutil is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    if psutil is None:
        return []
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def zombie_children(pid: int) -> list[int]:
    if psutil is None:
        return []
    out = []
    try:
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() == psutil.STATUS_ZOMBIE:
                    out.append(child.pid)
    except psutil.NoSuchProcess:
        pass
    return out


# --------------------------------------------------------------------------------------------
# the server


class ServerStartError(AssertionError):
    pass


@dataclass
class Server:
    proc: subprocess.Popen
    repo: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    argv: list[str]
    known_pids: set[int] = field(default_factory=set)

    # -- addresses (tritonclient takes host:port without a scheme)
    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def http_base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    # -- clients (every call carries a timeout)
    def http_client(self, network_timeout: float = 30.0, **kw: Any) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self.http_url, connection_timeout=10.0, network_timeout=network_timeout, **kw)

    def grpc_client(self, **kw: Any) -> Any:
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url, **kw)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        return http_get(self.http_base + path, timeout=timeout)

    def post(self, path: str, body: bytes = b"", timeout: float = 30.0,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return http_post(self.http_base + path, body, timeout=timeout, headers=headers)

    def metrics(self, timeout: float = 5.0) -> str:
        status, body = http_get(self.metrics_url, timeout=timeout)
        assert status == 200, f"GET /metrics -> {status}"
        return body.decode()

    # -- state
    def alive(self) -> bool:
        return self.proc.poll() is None

    def is_live(self) -> bool:
        try:
            return self.get("/v2/health/live", timeout=1.0)[0] == 200
        except OSError:
            return False

    def model_ready(self, name: str, version: str = "") -> bool:
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
        try:
            return self.get(path, timeout=1.0)[0] == 200
        except OSError:
            return False

    def wait_live(self, timeout: float = START_DEADLINE_S) -> None:
        self._wait(self.is_live, timeout, "server live")

    def wait_model_ready(self, name: str, timeout: float = START_DEADLINE_S) -> None:
        self._wait(lambda: self.model_ready(name), timeout, f"model {name!r} ready")

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"server exited with code {self.proc.returncode} while waiting for {what}\n"
                    f"argv: {self.argv}\n--- log tail ---\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise ServerStartError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                                       f"--- log tail ---\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """wait_for() that also fails at once if the server process exits."""
        def check() -> Any:
            if self.proc.poll() is not None:
                raise ServerStartError(f"server exited with code {self.proc.returncode} while waiting "
                                       f"for {what}\n--- log tail ---\n{self.log_tail()}")
            return predicate()

        deadline = time.monotonic() + timeout
        while True:
            try:
                value = check()
                if value:
                    return value
            except ServerStartError:
                raise
            except Exception:
                if time.monotonic() >= deadline:
                    raise
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
            time.sleep(POLL_INTERVAL_S)

    # -- inferd-only introspection: GET /v2/inferd/status
    def status(self) -> dict:
        import json

        code, body = self.get("/v2/inferd/status")
        assert code == 200, f"/v2/inferd/status -> {code}: {body[:200]!r}"
        return json.loads(body)

    def model_status(self, name: str) -> dict | None:
        for model in self.status().get("models", []):
            if model.get("name") == name:
                return model
        return None

    def instances(self, name: str) -> list[dict]:
        model = self.model_status(name)
        return list(model.get("instances", [])) if model else []

    def worker_pids(self, name: str | None = None) -> list[int]:
        pids = []
        for model in self.status().get("models", []):
            if name is not None and model.get("name") != name:
                continue
            for inst in model.get("instances", []):
                if inst.get("pid"):
                    pids.append(int(inst["pid"]))
        self.known_pids.update(pids)
        return pids

    def remember_pids(self) -> set[int]:
        """Record the server's current descendants (for leak checks after it stops)."""
        self.known_pids.add(self.pid)
        self.known_pids.update(descendants(self.pid))
        return set(self.known_pids)

    # -- stopping
    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, grace: float = STOP_GRACE_S) -> int:
        """SIGTERM, wait `grace` s, then SIGKILL; returns the exit code. Kills leftover workers."""
        self.remember_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.reap_leftovers()
        return self.proc.returncode

    def kill(self) -> None:
        self.remember_pids()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def leftover_pids(self) -> list[int]:
        return sorted(p for p in self.known_pids if p != self.pid and pid_alive(p))

    def reap_leftovers(self, wait: float = 3.0) -> list[int]:
        """Workers outliving the server are a bug the tests report; never leave them running."""
        deadline = time.monotonic() + wait
        while self.leftover_pids() and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        left = self.leftover_pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return left


def _server_argv(repo: Path, ports: list[int], control_mode: str, load_models: list[str],
                 extra_args: list[str], inferd_args: list[str], triton: bool) -> list[str]:
    common = [
        "--model-repository", str(repo),
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--model-control-mode", control_mode,
        "--exit-on-error", "false",
        "--strict-readiness", "true",
        "--exit-timeout-secs", "5",
    ]
    for name in load_models:
        common += ["--load-model", name]
    if triton:
        return ["bash", str(TRITON_SCRIPT), "run", *common, "--allow-gpu-metrics", "false", *extra_args]
    # INFERD_E2E_FRONTEND_PROCESSES=N runs every server with N frontend processes (a test's own flag wins)
    scaleout = ["--frontend-processes", FRONTEND_PROCESSES] if FRONTEND_PROCESSES else []
    return [str(INFERD_BIN), *common, *TEST_PROFILE_ARGS, *scaleout, *inferd_args, *extra_args]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """PR_SET_PDEATHSIG(SIGKILL): a test runner killed by pytest-timeout takes its servers along."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _check_binary(triton: bool) -> None:
    if triton:
        if not TRITON_SCRIPT.exists():
            pytest.fail(f"INFERD_E2E_TARGET=triton but {TRITON_SCRIPT} does not exist", pytrace=False)
        return
    if not INFERD_BIN.exists():
        msg = (f"the inferd server is not installed: {INFERD_BIN} does not exist. "
               f"Install the project into this interpreter's environment (pip install -e .)")
        if os.environ.get("INFERD_E2E_SKIP_MISSING"):
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)


class ServerFactory:
    """Callable building a repository and starting a server; stops everything it started on close."""

    def __init__(self, tmp_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_factory
        self.servers: list[Server] = []

    def make_repo(self, models: Iterable[str] | dict[str, str]) -> Path:
        repo = self._tmp.mktemp("repo")
        mapping = dict(models) if isinstance(models, dict) else {m: m for m in models}
        for dest, src in mapping.items():
            shutil.copytree(model_source(src), repo / dest,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            if dest != src:
                _rename_in_config(repo / dest / "config.pbtxt", src, dest)
        return repo

    def __call__(self, models: Iterable[str] | dict[str, str] = (), *, repo: Path | None = None,
                 control_mode: str = "none", load_models: Iterable[str] = (),
                 wait_ready: Iterable[str] | None = None, extra_args: Iterable[str] = (),
                 inferd_args: Iterable[str] = (), start_timeout: float = START_DEADLINE_S,
                 target: str | None = None) -> Server:
        """Start a server.

        target: "inferd" or "triton"; default: INFERD_E2E_TARGET.

        models: model names (fixture first, then example) or {name_in_repo: source_name}.
        wait_ready: models to wait for; default: all copied models (none mode) or `load_models`
        (explicit mode). Models expected to fail must be left out of it.
        """
        triton = target_is_triton() if target is None else target == "triton"
        _check_binary(triton)
        models = dict(models) if isinstance(models, dict) else list(models)
        if repo is None:
            repo = self.make_repo(models)
        names = list(models.keys()) if isinstance(models, dict) else list(models)
        load_models = list(load_models)
        if wait_ready is None:
            wait_ready = load_models if control_mode == "explicit" else names
        wait_ready = [m for m in wait_ready if m != "*"]
        last_error: BaseException | None = None
        for _attempt in range(2):  # a second try only if a port got taken in between
            ports = free_ports(3)
            argv = _server_argv(repo, ports, control_mode, load_models, list(extra_args), list(inferd_args),
                                triton)
            log_path = repo.parent / f"{repo.name}-server-{ports[0]}.log"
            with open(log_path, "wb") as log_file:
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=str(repo.parent), env=env,
                                        start_new_session=True, preexec_fn=_die_with_parent)
            server = Server(proc, repo, ports[0], ports[1], ports[2], log_path, argv)
            self.servers.append(server)
            try:
                deadline = time.monotonic() + start_timeout
                server.wait_live(timeout=start_timeout)
                for name in wait_ready:
                    server.wait_model_ready(name, timeout=max(1.0, deadline - time.monotonic()))
                server.remember_pids()
                return server
            except ServerStartError as exc:
                last_error = exc
                server.stop(grace=5)
                if "address already in use" not in server.log().lower():
                    break
        raise last_error  # type: ignore[misc]

    def close(self) -> None:
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.stop()
        self.servers.clear()


def _rename_in_config(config: Path, old: str, new: str) -> None:
    if not config.exists():
        return
    text = config.read_text()
    text = text.replace(f'name: "{old}"', f'name: "{new}"', 1)
    config.write_text(text)


@pytest.fixture(scope="session")
def harness() -> Any:
    """This module, for the helpers (wait_for, shm_snapshot, leak_free, ...): test modules cannot
    import a conftest reliably, so they take it as a fixture."""
    return sys.modules[__name__]


@pytest.fixture
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """One or more servers for a single test."""
    factory = ServerFactory(tmp_path_factory)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Servers shared by the tests of one module (tests that do not interfere)."""
    factory = ServerFactory(tmp_path_factory)
    yield factory
    factory.close()
