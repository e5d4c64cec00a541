"""infer-ctl restart (a model's rolling worker replacement, POST /v2/inferd/models/<m>/restart) and
infer-ctl log-level (the server's runtime log settings, Triton's GET/POST /v2/logging)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from . import render
from .client import Client, CtlError

LOGGING_PATH = "/v2/logging"
_SWITCHES = ("info", "warning", "error")


def restart_path(name: str) -> str:
    return f"/v2/inferd/models/{quote(name, safe='')}/restart"


def restart_view(doc: dict[str, Any]) -> str:
    rows = [[i.get("version"), i.get("name"), i.get("restarted"), i.get("pid_before"), i.get("pid_after"),
             i.get("state")] for i in doc.get("instances") or []]
    return render.table(["VERSION", "INSTANCE", "RESTARTED", "OLD PID", "NEW PID", "STATE"], rows)


def cmd_restart(args: argparse.Namespace, client: Client) -> int:
    try:
        doc = client.post(restart_path(args.name), None, timeout=args.timeout)
    except CtlError as exc:
        if exc.status == 404 and exc.message == "Not Found":  # the router's own 404: no such endpoint
            raise CtlError("the server has no rolling restart (not inferd, or an older one)", 404) from None
        raise
    if not isinstance(doc, dict):
        raise CtlError(f"unexpected reply from {restart_path(args.name)}")
    print(json.dumps(doc) if args.json else restart_view(doc))
    not_restarted = [i.get("name") for i in doc.get("instances") or [] if not i.get("restarted")]
    if not_restarted:
        print(f"error: not restarted (not ready, or the replacement failed to start; see the server log): "
              f"{', '.join(str(n) for n in not_restarted)}", file=sys.stderr)
        return 1
    return 0


def logging_view(doc: dict[str, Any]) -> str:
    return render.table(["SETTING", "VALUE"], [[k, v] for k, v in sorted(doc.items())])


def _update(args: argparse.Namespace) -> dict[str, Any]:
    update: dict[str, Any] = {}
    if args.verbose is not None:
        update["log_verbose_level"] = args.verbose
    for switch in _SWITCHES:
        value = getattr(args, switch)
        if value is not None:
            update["log_" + switch] = value == "on"
    if args.format is not None:
        update["log_format"] = args.format
    return update


def cmd_log_level(args: argparse.Namespace, client: Client) -> int:
    update = _update(args)
    doc = client.post(LOGGING_PATH, update) if update else client.get(LOGGING_PATH)
    if not isinstance(doc, dict):
        raise CtlError(f"unexpected reply from {LOGGING_PATH}")
    print(json.dumps(doc) if args.json else logging_view(doc))
    return 0


def add_parsers(add: Callable[..., Any]) -> None:
    """The two commands, through main.py's `add(name, fn, help)`."""
    p = add("restart", cmd_restart, "replace a model's worker processes one instance at a time, without failing "
                                    "a request (each replacement is ready before the old worker stops)")
    p.add_argument("name")
    p = add("log-level", cmd_log_level, "show the server's log settings, or change them at runtime")
    p.add_argument("--verbose", type=int, metavar="LEVEL", help="log_verbose_level (0 = off)")
    for switch in _SWITCHES:
        p.add_argument("--" + switch, choices=("on", "off"), help=f"log_{switch}")
    p.add_argument("--format", choices=("default", "ISO8601", "json"), help="log_format")
