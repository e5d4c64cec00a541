"""The model load API's parameters: a load request's `config` JSON and `file:<path>` overrides.

Code under test, real from the HTTP body on: the router's load route (`http_api/routes.py`: the JSON body,
base64 of the files), `ServerDataPlane.load_model` (the parameters), `core/loader.plan_load` (the override
directory by `core/overrides.py`, the repository read, `parse_json_config`, normalisation). Only the model
manager around them is left out: its `load` here plans the load, checks the plan and discards it (no worker
is started); a real server would then start the plan's instances.

Invariants:
- every request is either accepted or refused as a client error (HTTP 400 / InferdError INVALID_ARG), never
  a 500 or another exception (issue 38 #6: ENAMETOOLONG, `file:1` with `file:1/model.py`);
- an accepted load's files are exactly the `file:` parameters, written under
  <run dir>/overrides/load-*/<model>/ and nowhere else: nothing changes outside the run dir's overrides
  folder, and nothing under it outside that load's own directory;
- what `discard_override` (or a refused load) leaves: nothing (issue 38 #4).

Data: one mode byte, then
- 0: the HTTP body of a load request (seeds: what tritonclient.http's load_model sends, fuzz/seeds/override_seeds.py);
- 1: parameters built from the bytes: `file:` paths from parts that matter (version dirs, "..", absolute,
  empty and long names, NUL, non-UTF-8, a file and a directory of one name, the same file twice), contents,
  a config that is JSON of a config or not, other keys, values of other types.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import tempfile
from typing import Any

from _fdp import FDP, provider
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.core import loader
from inferd.supervisor.core.dataplane_impl import ServerDataPlane
from inferd.supervisor.core.load_settings import LoaderSettings
from inferd.supervisor.core.runtime import Runtime
from inferd.supervisor.http_api.request_cycle import Request
from inferd.supervisor.http_api.routes import Router
from inferd.worker.wire.errors import ErrorCode, InferdError

MAX_LEN = 8192
MODEL = "m"
CONFIG = {"name": MODEL, "backend": "python", "max_batch_size": 0,
          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
MODEL_PY = b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


class Finding(AssertionError):
    pass


class _Manager:
    """The model manager's part of a load that matters here: plan it (real code), check the plan, discard it."""

    def __init__(self, settings: LoaderSettings) -> None:
        self.settings = settings
        self.plans: list[loader.LoadPlan] = []
        self.files: dict[str, bytes] = {}

    async def load(self, name: str, config: str | None, files: dict[str, bytes] | None) -> None:
        loader.check_model_name(name)
        self.files = dict(files or {})
        plan = await loader.plan_load(self.settings, name, config, files)
        try:
            _check_plan(self.settings.runtime.run_dir, plan, self.files)
        finally:
            loader.discard_override(plan)


class _Plane:
    """The data plane's load API: ServerDataPlane's own methods over the manager above."""

    remote = False
    control_mode = "explicit"
    _check_explicit = ServerDataPlane._check_explicit
    load_model = ServerDataPlane.load_model

    def __init__(self, manager: _Manager) -> None:
        self.manager = manager


_state: dict[str, Any] = {}


def setup() -> None:
    parent = tempfile.mkdtemp(prefix="override-fuzz-")
    repo, run_dir = os.path.join(parent, "repo"), os.path.join(parent, "run")
    os.makedirs(os.path.join(repo, MODEL, "1"))
    os.makedirs(run_dir)
    with open(os.path.join(repo, MODEL, "config.pbtxt"), "w") as f:
        f.write('backend: "python"\n')
    with open(os.path.join(repo, MODEL, "1", "model.py"), "wb") as f:
        f.write(MODEL_PY)
    runtime = Runtime(run_dir, False, None, None, None, None)  # type: ignore[arg-type]  # (no workers started)
    settings = LoaderSettings((repo,), True, 0, 0.0, WorkerTimings(), 0, runtime)
    manager = _Manager(settings)
    _state.update(parent=parent, run_dir=run_dir, manager=manager, router=Router(_Plane(manager)),
                  loop=asyncio.new_event_loop())


def _snapshot(parent: str) -> dict[str, tuple[str, int, bytes]]:
    """Every path under `parent` with its kind, size and (for small files) content."""
    out = {}
    for dirpath, dirs, files in os.walk(parent):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "d" if os.path.isdir(path) and not os.path.islink(path) else "l" if os.path.islink(path) else "f"
            content = b""
            if kind == "f" and st.st_size <= 4096:
                with open(path, "rb") as f:
                    content = f.read()
            out[os.path.relpath(path, parent)] = (kind, st.st_size, content)
    return out


def _check_plan(run_dir: str, plan: loader.LoadPlan, files: dict[str, bytes]) -> None:
    if not files:
        if plan.override_root is not None:
            raise Finding("a load without file: parameters got an override directory")
        return
    base = os.path.realpath(os.path.join(run_dir, "overrides"))
    root = plan.override_root
    if root is None or os.path.dirname(os.path.realpath(root)) != base:
        raise Finding(f"the override directory {root!r} is not in {base}")
    model_dir = os.path.join(root, MODEL)
    if os.path.realpath(plan.source.path) != os.path.realpath(model_dir):
        raise Finding(f"the model is read from {plan.source.path}, not from its override directory {model_dir}")
    written = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.realpath(path).startswith(os.path.realpath(model_dir) + os.sep):
                raise Finding(f"{path} is not a file inside {model_dir}")
            with open(path, "rb") as f:
                written[os.path.relpath(path, model_dir)] = f.read()
    expected = {os.path.normpath(k): v for k, v in files.items()}
    if written != expected:
        raise Finding(f"the override directory holds {sorted(written)}, the request gave {sorted(expected)}")


def check_body(body: bytes) -> None:
    router, loop, parent = _state["router"], _state["loop"], _state["parent"]
    run_dir = _state["run_dir"]
    before = {k: v for k, v in _snapshot(parent).items() if not k.startswith("run" + os.sep + "overrides")}
    request = Request("POST", f"/v2/repository/models/{MODEL}/load", "", {}, body, True)
    try:
        response = loop.run_until_complete(router._repo_control(request, "load", MODEL))
        status, text = response.status, bytes(response.body)
    except InferdError as exc:  # refused by the route before the data plane (the router answers 400)
        if exc.code != ErrorCode.INVALID_ARG:
            raise Finding(f"refused with {exc!r}") from None
        status, text = 400, b""
    if status not in (200, 400):
        raise Finding(f"answered {status} {text[:300]!r} for {body[:300]!r}")
    after = {k: v for k, v in _snapshot(parent).items() if not k.startswith("run" + os.sep + "overrides")}
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        raise Finding(f"the load changed files outside its override directory: {changed[:5]}")
    left = os.listdir(os.path.join(run_dir, "overrides")) if os.path.isdir(os.path.join(run_dir, "overrides")) else []
    if left:
        for name in left:
            shutil.rmtree(os.path.join(run_dir, "overrides", name), ignore_errors=True)
        raise Finding(f"override directories left behind: {left}")


# ---- parameters from the bytes ---------------------------------------------------------------------------

_PARTS = ["1", "2", "model.py", "config.pbtxt", "..", ".", "", "a" * 255, "a" * 256, "é" * 128, "\x00",
          "\udcff", "labels.txt", "1/model.py", "x/../..", "/etc", "~", " ", "-1", "0", "00"]


def _path(fdp: FDP) -> str:
    return "/".join(fdp.PickValueInList(_PARTS) for _ in range(fdp.ConsumeIntInRange(1, 4)))


def _config(fdp: FDP) -> Any:
    kind = fdp.ConsumeIntInRange(0, 5)
    doc: dict[str, Any] = json.loads(json.dumps(CONFIG))
    if kind == 0:
        return json.dumps(doc)
    if kind == 1:
        doc[fdp.PickValueInList(["name", "backend", "max_batch_size", "input", "platform", "parameters",
                                 "instance_group", "bogus", "default_model_filename", "version_policy"])] = \
            fdp.PickValueInList(["other", "", 4, -1, [], {}, None, True, "../x", {"EXECUTION_ENV_PATH": {}},
                                 [{"kind": "kind_gpu"}], {"latest": {"num_versions": 0}}, 1e300])
        return json.dumps(doc)
    if kind == 2:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)).decode("utf-8", "replace")
    if kind == 3:
        return fdp.PickValueInList(["{}", "[]", "null", "1", '"x"', '{"name": 1}', "[" * 5000, '{"input": [{}]}'])
    if kind == 4:
        return fdp.PickValueInList([None, 1, True, ["x"], {"a": 1}])
    return json.dumps(doc)[: fdp.ConsumeIntInRange(0, 80)]


def built(fdp: FDP) -> bytes:
    params: dict[str, Any] = {}
    if fdp.ConsumeIntInRange(0, 4):
        params["config"] = _config(fdp)
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        key = "file:" + (_path(fdp) if fdp.ConsumeBool() else fdp.PickValueInList(["1/model.py", "1", "2/model.py"]))
        content = fdp.PickValueInList([MODEL_PY, b"", b"\x00\xff", b"not python"])
        params[key] = base64.b64encode(content).decode() if fdp.ConsumeIntInRange(0, 7) else \
            fdp.PickValueInList(["***", 5, None, "YQ", "YQ=="])
    if fdp.ConsumeIntInRange(0, 7) == 0:
        params[fdp.PickValueInList(["unload_dependents", "files", "File:1", "config "])] = True
    doc: Any = {"parameters": params}
    if fdp.ConsumeIntInRange(0, 9) == 0:
        doc = fdp.PickValueInList([{"parameters": []}, [], {"parameters": {"config": 1}}])
    return json.dumps(doc, ensure_ascii=fdp.ConsumeBool()).encode("utf-8", "surrogatepass")


def test_one_input(data: bytes) -> None:
    if not _state:
        setup()
    if not data:
        return
    check_body(data[1:] if data[0] % 2 == 0 else built(provider(data[1:])))
