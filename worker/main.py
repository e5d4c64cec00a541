"""Worker entry point: bootstrap line on stdin -> lifelines -> sockets -> Hello -> message loop.

Exit codes: 0 after Shutdown/Bye; 2 bad bootstrap; 3 protocol error from the supervisor;
4 supervisor lost (stdin EOF, heartbeat silence, wrong parent); 5 unexpected worker failure.
Start-up imports only the standard library, numpy and pyzmq; backends load on LoadModel.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from typing import Any, Optional

from . import log_lines

EXIT_OK = 0
EXIT_BOOTSTRAP = 2
EXIT_PROTOCOL = 3
EXIT_SUPERVISOR_LOST = 4
EXIT_INTERNAL = 5
_PR_SET_TIMERSLACK = 29

_PREFIX = ["inferd-worker[%d]" % os.getpid()]


def log(message: str) -> None:
    try:
        if log_lines.is_json():
            sys.stderr.write(log_lines.json_line("E", _PREFIX[0], message))
        else:
            sys.stderr.write("%s: %s\n" % (_PREFIX[0], message))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _lost(reason: str) -> None:
    log("exiting: %s" % reason)
    os._exit(EXIT_SUPERVISOR_LOST)


def parse_bootstrap(line: bytes) -> dict[str, Any]:
    doc = json.loads(line.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("bootstrap is not a JSON object")
    for key, kind in (("wire_version", int), ("endpoint", str), ("identity", str)):
        if not isinstance(doc.get(key), kind):
            raise ValueError("bootstrap key %r missing or not %s" % (key, kind.__name__))
    return doc


class _SupervisorImportGuard:
    """Meta-path finder refusing `inferd.*` modules other than the worker's own (an editable or
    site-packages install could otherwise hand the supervisor to model code in this process)."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.startswith("inferd.") and not (fullname == _WORKER or fullname.startswith(_WORKER + ".")):
            raise ModuleNotFoundError(
                "No module named %r (a worker cannot import the supervisor)" % fullname, name=fullname
            )
        return None


_WORKER = __name__.rsplit(".", 1)[0]  # "inferd.worker"


def install_import_guard() -> None:
    if not any(isinstance(f, type) and f.__name__ == "_SupervisorImportGuard" for f in sys.meta_path):
        sys.meta_path.insert(0, _SupervisorImportGuard)  # type: ignore[arg-type]


_VERSION_RE = re.compile(r"""^_*(?:full_)?version_*\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.M)


def tighten_timer_slack(slack_ns: int = 1) -> bool:
    """Timed waits in model code (time.sleep, a timeout on a lock or a remote call) end on time.
    Linux lets a thread's timers fire up to 50 µs late by default; each execute pays that on the
    request's path (a 5 ms sleep measured 5.23 ms on average here, 5.17 ms with 1 ns). False where
    unsupported."""
    from . import lifeline

    return lifeline.prctl(_PR_SET_TIMERSLACK, slack_ns)


def numpy_version() -> str:
    """numpy's version without importing numpy (about 100 ms, spent after Hello instead):
    read from numpy/version.py; falls back to importing it."""
    module = sys.modules.get("numpy")
    if module is None:
        try:
            import importlib.util

            spec = importlib.util.find_spec("numpy")
            locations = list(spec.submodule_search_locations or []) if spec else []
            for location in locations:
                with open(os.path.join(location, "version.py"), encoding="utf-8") as f:
                    found = _VERSION_RE.search(f.read())
                if found:
                    return found.group(1)
        except (ImportError, OSError, ValueError):
            pass
        import numpy

        module = numpy
    return str(getattr(module, "__version__", "unknown"))


def main(argv: Optional[list] = None) -> int:
    install_import_guard()
    from . import lifeline

    try:
        boot = parse_bootstrap(lifeline.read_line(0))
    except (ValueError, OSError) as exc:
        log("bad bootstrap: %s" % exc)
        return EXIT_BOOTSTRAP
    instance = str(boot.get("instance_name") or boot["identity"])
    _PREFIX[0] = "inferd-worker[%s %d]" % (instance, os.getpid())
    log_lines.configure(str(boot.get("log_format") or "default"), instance=instance)
    supervisor_pid = boot.get("supervisor_pid")
    tighten_timer_slack()  # before any thread starts: threads inherit it
    lifeline.arm(int(supervisor_pid) if supervisor_pid else None, _lost)
    if hasattr(sys.stdout, "reconfigure"):
        try:
            sys.stdout.reconfigure(line_buffering=True)
        except (ValueError, OSError):
            pass
    try:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops us with Shutdown
    except (ValueError, OSError):
        pass

    import zmq

    from .channel import Channel, HeartbeatThread
    from .metric_registry import REGISTRY as custom_metrics
    from .metrics_sender import MetricsSender
    from .wire.messages import WIRE_VERSION, Hello, ProtocolError

    if boot["wire_version"] != WIRE_VERSION:
        log("wire version %s requested, this worker speaks %d" % (boot["wire_version"], WIRE_VERSION))
    context = zmq.Context()
    channel = Channel(boot["endpoint"], boot["identity"])
    metrics = MetricsSender(context, boot["endpoint"], boot["identity"], custom_metrics)
    custom_metrics.sync = metrics.sync
    heartbeat = HeartbeatThread(
        context, boot["endpoint"], boot["identity"], float(boot.get("heartbeat_interval_s") or 1.0),
        float(boot.get("heartbeat_timeout_s") or 0.0), _lost, metrics=metrics,
    )
    heartbeat.start()
    channel.send(Hello(
        wire_version=WIRE_VERSION, pid=os.getpid(), instance_name=instance,
        python_version="%d.%d.%d" % sys.version_info[:3], numpy_version=numpy_version(),
        zmq_version=zmq.pyzmq_version(),
    ))
    from . import bls
    from .message_loop import Runtime  # numpy is imported here, after Hello is on its way

    bls.configure(context, boot["endpoint"], boot["identity"])

    def open_readiness(check: Any) -> Any:  # a model defining is_ready(): its own socket (readiness.py)
        from .readiness import ReadinessResponder

        responder = ReadinessResponder(context, boot["endpoint"], boot["identity"], check, log)
        responder.start()
        return responder

    runtime = Runtime(channel, log_verbose=int(boot.get("log_verbose") or 0), log=log, metrics=metrics.flush,
                      readiness=open_readiness)
    code = EXIT_OK
    try:
        runtime.run()
    except ProtocolError as exc:
        log("protocol error: %s" % exc)
        code = EXIT_PROTOCOL
    except Exception as exc:  # a bug in the worker itself
        log("internal error: %s: %s" % (type(exc).__name__, exc))
        code = EXIT_INTERNAL
    runtime.stop_readiness()  # its socket closes before the context ends
    _finish(context, channel, heartbeat, code)
    return code


def _finish(context: Any, channel: Any, heartbeat: Any, code: int) -> None:
    """Flush Bye (linger), stop the heartbeat thread, and make sure the process ends even if
    model code left non-daemon threads behind."""
    watchdog = threading.Timer(3.0, os._exit, args=(code,))
    watchdog.daemon = True
    watchdog.start()
    from . import bls

    bls.shutdown()
    heartbeat.stop()
    heartbeat.join(timeout=1.0)
    channel.close()
    if not heartbeat.is_alive():
        context.term()  # waits (up to the linger) for Bye to leave
