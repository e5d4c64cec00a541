"""infer-ctl: manage a running inferd (or Triton) server through its public HTTP API.

Exit status: 0 success; 1 the server refused or could not be reached (``error: <message>`` on
stderr; with --json also ``{"error": ...}`` on stdout); 2 bad usage; 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from . import env as env_cmd
from . import render, runtime_cmds
from .client import DEFAULT_URL, Client, CtlError, model_path

STATUS_PATH = "/v2/inferd/status"


def _out(args: argparse.Namespace, doc: Any, human: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2 if args.command == "config" else None))
    else:
        print(human())


def _read_config(text: str) -> str:
    """--config value: JSON text, or @path of a file holding it. Checked here, sent as text."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise CtlError(f"cannot read config file {text[1:]}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CtlError("--config must be a JSON object (a ModelConfig)")
    return text


def _read_file_param(spec: str) -> tuple[str, str]:
    """--file 1/model.py=./model.py -> ("file:1/model.py", base64 of the local file)."""
    target, sep, local = spec.partition("=")
    if not sep or not target or not local:
        raise CtlError(f"--file expects VERSION/PATH=LOCAL_FILE, got {spec!r}")
    try:
        with open(local, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CtlError(f"cannot read {local}: {exc.strerror}") from None
    return "file:" + target, base64.b64encode(data).decode("ascii")


def _wait_with_progress(what: str, work: Callable[[], Any], stream: TextIO) -> tuple[Any, float]:
    """Run work() (a blocking request); on a TTY show a spinner and the elapsed time meanwhile."""
    start = time.monotonic()
    if not stream.isatty():
        return work(), time.monotonic() - start
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    thread = threading.Thread(target=runner, name="infer-ctl-request", daemon=True)
    thread.start()
    frames = "|/-\\"
    tick = 0
    try:
        while thread.is_alive():
            thread.join(0.1)
            stream.write(f"\r{frames[tick % 4]} {what} {time.monotonic() - start:.1f}s ")
            stream.flush()
            tick += 1
    finally:
        stream.write("\r\033[K")
        stream.flush()
    if "error" in box:
        raise box["error"]
    return box.get("result"), time.monotonic() - start


# ---- commands ----
def cmd_load(args: argparse.Namespace, client: Client) -> int:
    params: dict[str, str] = {}
    if args.config is not None:
        params["config"] = _read_config(args.config)
    for spec in args.file or []:
        key, value = _read_file_param(spec)
        params[key] = value
    if any(k.startswith("file:") for k in params) and "config" not in params:
        raise CtlError("--file needs --config (the server requires a config with file overrides)")
    body = {"parameters": params} if params else None
    path = f"/v2/repository/models/{quote(args.name, safe='')}/load"
    _, elapsed = _wait_with_progress(
        f"loading {args.name}", lambda: client.post(path, body, timeout=args.timeout), sys.stderr
    )
    entries = [e for e in client.post("/v2/repository/index") or [] if e.get("name") == args.name]
    doc = {"name": args.name, "loaded": True, "elapsed_s": round(elapsed, 3), "versions": entries}
    _out(args, doc, lambda: f"loaded {args.name} in {elapsed:.2f}s\n{render.index_view(entries)}")
    return 0


def cmd_unload(args: argparse.Namespace, client: Client) -> int:
    body = {"parameters": {"unload_dependents": True}} if args.unload_dependents else None
    path = f"/v2/repository/models/{quote(args.name, safe='')}/unload"
    _, elapsed = _wait_with_progress(
        f"unloading {args.name}", lambda: client.post(path, body, timeout=args.timeout), sys.stderr
    )
    doc = {"name": args.name, "unloaded": True, "elapsed_s": round(elapsed, 3)}
    _out(args, doc, lambda: f"unloaded {args.name} in {elapsed:.2f}s")
    return 0


def cmd_index(args: argparse.Namespace, client: Client) -> int:
    entries = client.post("/v2/repository/index", {"ready": True} if args.ready else None) or []
    _out(args, entries, lambda: render.index_view(entries))
    return 0


def _status_missing(exc: CtlError) -> bool:
    """The server has no inferd status endpoint (an older inferd, or Triton): its router's 404."""
    return (exc.status == 404 and exc.message == "Not Found") or exc.status in (405, 501)


def _status_from_index(client: Client, name: str) -> dict[str, Any]:
    entries = client.post("/v2/repository/index") or []
    if name:
        entries = [e for e in entries if e.get("name") == name]
        if not entries:
            raise CtlError(f"Request for unknown model: '{name}' is not found")
    models = [
        {"name": e.get("name"), "version": e.get("version", ""), "state": e.get("state", "UNKNOWN"),
         "reason": e.get("reason", ""), "instances": None}
        for e in entries
    ]
    return {"models": models, "source": "index"}


def cmd_status(args: argparse.Namespace, client: Client) -> int:
    path = STATUS_PATH + ("/models/" + quote(args.name, safe="") if args.name else "")
    try:
        doc = client.get(path)
    except CtlError as exc:
        if not _status_missing(exc):
            raise
        doc = _status_from_index(client, args.name or "")
        if not args.json:
            print(f"(server has no {STATUS_PATH}: repository index only)", file=sys.stderr)
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise CtlError(f"unexpected reply from {path}")
    _out(args, doc, lambda: render.status_view(doc))
    return 0


def cmd_config(args: argparse.Namespace, client: Client) -> int:
    doc = client.get(model_path(args.name, args.model_version) + "/config")
    print(json.dumps(doc, indent=2))
    return 0


def cmd_stats(args: argparse.Namespace, client: Client) -> int:
    if args.name:
        doc = client.get(model_path(args.name, args.model_version) + "/stats")
    else:
        doc = client.get("/v2/models/stats")
    _out(args, doc, lambda: render.stats_view(doc or {}))
    return 0


def _probe(client: Client, path: str) -> bool:
    status, _ = client.request("GET", path)
    return status == 200


def cmd_health(args: argparse.Namespace, client: Client) -> int:
    try:
        live = _probe(client, "/v2/health/live")
        ready = False if args.live or not live else _probe(client, "/v2/health/ready")
    except CtlError as exc:
        if args.json:
            print(json.dumps({"live": False, "ready": False, "error": exc.message}))
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    doc: dict[str, Any] = {"live": live} if args.live else {"live": live, "ready": ready}
    human = f"live: {render.cell(live)}" + ("" if args.live else f"\nready: {render.cell(ready)}")
    _out(args, doc, lambda: human)
    return 0 if live and (args.live or ready) else 1


def cmd_metadata(args: argparse.Namespace, client: Client) -> int:
    doc = client.get(model_path(args.name, args.model_version))
    _out(args, doc, lambda: render.metadata_view(doc or {}))
    return 0


def cmd_server(args: argparse.Namespace, client: Client) -> int:
    doc = client.get("/v2")
    _out(args, doc, lambda: render.server_view(doc or {}))
    return 0


# ---- parser ----
def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    """--url/--timeout/--json, accepted before or after the command (sub-level ones win)."""
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument("--url", default=default(None),
                        help=f"server HTTP address (default: $INFERD_URL or {DEFAULT_URL})")
    parser.add_argument("--timeout", type=float, default=default(None), metavar="SECONDS",
                        help="give up after this long; 0 = never (default: 30; load/unload: never)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print the server's JSON (for scripts) instead of tables")
    parser.add_argument("--header", action="append", default=default(None), metavar="NAME=VALUE",
                        help="send this HTTP header with every request (repeatable): the key a server "
                             "started with --http-restricted-api asks for")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infer-ctl", description="Manage an inferd server through its HTTP API.",
        epilog="Exit status: 0 ok, 1 error (message on stderr), 2 usage.",
    )
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, fn: Callable[..., int], help_text: str, aliases: tuple[str, ...] = ()) -> Any:
        p = sub.add_parser(name, help=help_text, description=help_text, aliases=list(aliases))
        _common(p, top=False)
        p.set_defaults(fn=fn)
        return p

    p = add("load", cmd_load, "load (or reload) a model and wait until it is done")
    p.add_argument("name")
    p.add_argument("--config", metavar="JSON|@FILE", help="ModelConfig JSON overriding config.pbtxt")
    p.add_argument("--file", action="append", metavar="VERSION/PATH=LOCAL",
                   help="override a model file (repeatable; needs --config)")
    p = add("unload", cmd_unload, "unload a model and wait until it is done")
    p.add_argument("name")
    p.add_argument("--unload-dependents", action="store_true",
                   help="also unload models loaded as its dependencies (ensemble steps)")
    p = add("index", cmd_index, "list the models in the repository", aliases=("list",))
    p.add_argument("--ready", action="store_true", help="only READY versions")
    p = add("status", cmd_status, "model states, instances, worker pids and restarts")
    p.add_argument("name", nargs="?", default="")
    p = add("config", cmd_config, "print a model's configuration as JSON")
    p.add_argument("name")
    p.add_argument("--version", dest="model_version", default="", help="model version")
    p = add("stats", cmd_stats, "inference statistics (counts, average queue and compute times)")
    p.add_argument("name", nargs="?", default="")
    p.add_argument("--version", dest="model_version", default="", help="model version")
    p = add("health", cmd_health, "server liveness and readiness (exit 0 when ready)")
    p.add_argument("--live", action="store_true", help="check liveness only")
    p = add("metadata", cmd_metadata, "a model's versions, platform, inputs and outputs")
    p.add_argument("name")
    p.add_argument("--version", dest="model_version", default="", help="model version")
    add("server", cmd_server, "server name, version and protocol extensions")
    runtime_cmds.add_parsers(add)
    env_cmd.add_parser(sub, _common)
    return parser


def _headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise CtlError(f"--header {value!r}: expected NAME=VALUE")
        headers[name.strip()] = text
    return headers


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        args.command = "index"
    url = args.url or os.environ.get("INFERD_URL") or DEFAULT_URL
    if args.timeout is None:
        # a load replies when it is done, however long initialize() takes: no limit by default
        client_timeout: float | None = 30.0
        args.timeout = None if args.command in ("load", "unload", "restart") else 30.0
    else:
        args.timeout = client_timeout = args.timeout if args.timeout > 0 else None
    try:
        if getattr(args, "local", False):
            return env_cmd.run(args)
        client = Client(url, timeout=client_timeout, headers=_headers(args.header or []))
        return int(args.fn(args, client))
    except CtlError as exc:
        if args.json:
            print(json.dumps({"error": exc.message}))
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
