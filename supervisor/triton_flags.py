"""tritonserver flags inferd takes without acting on them, and the values it refuses, so that a Triton
command line starts inferd unchanged or stops with an error naming the flag, never runs otherwise than
it says. docs/triton-flags.md lists every flag of tritonserver 2.73 with its status in inferd;
tests/unit/test_triton_flag_list.py holds flags.py and this module to that list.

The flags inferd implements are in flags.py. Here:
- IGNORED: flags Triton itself ignores where inferd would use them (without a GPU, or while the endpoint
  they configure is off, which inferd keeps off);
- INERT: sizes of Triton's own thread and object pools, and where its libraries live: nothing in inferd
  corresponds, and nothing a client sees depends on them;
- UNSUPPORTED: values asking for what inferd does not do (SageMaker, Vertex AI, compressed gRPC
  responses) stop the start.
IGNORED and INERT flags given are named in the start-up log. Every value is checked as tritonserver
checks it (an integer where it reads one, its ranges and formats), so a command line it refuses is
refused here too.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

# flag -> why Triton ignores it here
IGNORED: dict[str, str] = {
    "--pinned-memory-pool-byte-size": "without a GPU (it allocates the pool with CUDA)",
    "--cuda-memory-pool-byte-size": "without a GPU; inferd's GPU tensors live in their worker's framework",
    "--cuda-virtual-address-size": "without a GPU (growable implicit state on the GPU)",
    "--min-supported-compute-capability": "without a GPU",
    "--enable-peer-access": "without a GPU",
    "--model-load-gpu-limit": "without a GPU (it limits loads onto a GPU)",
    "--sagemaker-port": "unless --allow-sagemaker=true, which inferd refuses",
    "--sagemaker-safe-port-range": "unless --allow-sagemaker=true, which inferd refuses",
    "--sagemaker-thread-count": "unless --allow-sagemaker=true, which inferd refuses",
    "--vertex-ai-port": "unless --allow-vertex-ai=true, which inferd refuses",
    "--vertex-ai-thread-count": "unless --allow-vertex-ai=true, which inferd refuses",
    "--vertex-ai-default-model": "unless --allow-vertex-ai=true, which inferd refuses",
}

# flag -> why it changes nothing in inferd
INERT: dict[str, str] = {
    "--http-thread-count": "the supervisor's event loop serves HTTP (--frontend-processes adds processes)",
    "--grpc-infer-thread-count": "the supervisor's event loop serves gRPC (--frontend-processes adds processes)",
    "--grpc-infer-allocation-pool-size": "no pool of gRPC request/response objects",
    "--grpc-max-response-pool-size": "no pool of gRPC response objects; a stream's responses wait in HTTP/2 "
                                     "flow control",
    "--buffer-manager-thread-count": "tensors travel through shared memory, no buffer manager threads",
    "--backend-config": "settings of Triton's backend libraries (python: its stub's shared memory and "
                        "timeouts); inferd's backends take none",
    "--cache-directory": "the local cache is built in (no cache libraries to load)",
}

# tritonserver's reading of each value above: int, float, <int>:<int>, <int>:<float>, <int>-<int>,
# [<name>,]<setting>=<value>; anything else is taken as a string
VALUE_KINDS: dict[str, str] = {
    "--pinned-memory-pool-byte-size": "int", "--cuda-memory-pool-byte-size": "int:int",
    "--cuda-virtual-address-size": "int:int", "--min-supported-compute-capability": "float",
    "--enable-peer-access": "bool", "--model-load-gpu-limit": "int:float", "--sagemaker-port": "int",
    "--sagemaker-safe-port-range": "int-int", "--sagemaker-thread-count": "int", "--vertex-ai-port": "int",
    "--vertex-ai-thread-count": "int", "--http-thread-count": "int", "--grpc-infer-thread-count": "int",
    "--grpc-infer-allocation-pool-size": "int", "--grpc-max-response-pool-size": "int",
    "--buffer-manager-thread-count": "int", "--backend-config": "setting",
}
# tritonserver's ranges: flag -> (lowest, highest or None)
RANGES: dict[str, tuple[int, int | None]] = {
    "--grpc-infer-thread-count": (2, 128),
    "--grpc-max-response-pool-size": (1, None),
}

# flag -> (the values inferd runs as asked, what the other values would need)
UNSUPPORTED: dict[str, tuple[tuple[str, ...], str]] = {
    "--allow-sagemaker": (("false", "0", "no", "off"), "a SageMaker endpoint"),
    "--allow-vertex-ai": (("false", "0", "no", "off"), "a Vertex AI endpoint"),
    "--grpc-infer-response-compression-level": (("none",), "compressed gRPC responses (it sends them uncompressed)"),
}
# values tritonserver takes at all (lower case); others are refused as invalid before UNSUPPORTED is asked
CHOICES: dict[str, tuple[str, ...]] = {
    "--grpc-infer-response-compression-level": ("none", "low", "medium", "high"),
}

_INT = re.compile(r"[+-]?\d+")
_TRITON_BOOLS = ("true", "on", "1", "false", "off", "0")


def _dest(flag: str) -> str:
    return "triton_" + flag.lstrip("-").replace("-", "_")


def add_to(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tritonserver flags accepted for compatibility")
    for flag, why in IGNORED.items():
        group.add_argument(flag, dest=_dest(flag), action="append", metavar="VALUE",
                           help=f"ignored, as tritonserver ignores it {why}")
    for flag, why in INERT.items():
        group.add_argument(flag, dest=_dest(flag), action="append", metavar="VALUE",
                           help=f"no effect: {why}")
    for flag, (ok, needs) in UNSUPPORTED.items():
        allowed = f" (only {ok[0]} is accepted)" if ok else ""
        group.add_argument(flag, dest=_dest(flag), action="append", metavar="VALUE",
                           help=f"would need {needs}, which inferd does not have{allowed}")


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def value_error(flag: str, value: str) -> str | None:
    """Why tritonserver would refuse `value` for `flag` (None: it reads it)."""
    kind = VALUE_KINDS.get(flag, "str")
    text = value.strip()
    if kind == "int" and not _INT.fullmatch(text):
        return f"{flag}={value}: expected an integer"
    if kind == "float" and not _is_float(text):
        return f"{flag}={value}: expected a number"
    if kind == "bool" and text.lower() not in _TRITON_BOOLS:
        return f"{flag}={value}: expected true or false"
    if kind in ("int:int", "int:float", "int-int"):
        sep, second = kind[3], kind[4:]
        first, found, rest = text.partition(sep)
        if not found or not _INT.fullmatch(first) or not (
                _INT.fullmatch(rest) if second == "int" else _is_float(rest)):
            return f"{flag}={value}: expected <{'device' if sep == ':' else 'int'}>{sep}<{second}>"
    if kind == "setting":
        name, comma, rest = text.partition(",")
        setting, eq, val = (rest if comma else name).partition("=")
        if (comma and not name) or not eq or not setting or not val:
            return f"{flag}={value}: expected <backend name>,<setting>=<value> or <setting>=<value>"
    if flag in RANGES and _INT.fullmatch(text):
        low, high = RANGES[flag]
        if int(text) < low or (high is not None and int(text) > high):
            return f"{flag}={value}: must be " + (f"between {low} and {high}" if high is not None
                                                  else f"at least {low}")
    if flag in CHOICES and text.lower() not in CHOICES[flag]:
        return f"{flag}={value}: expected one of {', '.join(CHOICES[flag])}"
    return None


def refusals(args: argparse.Namespace) -> list[str]:
    """An error line per value tritonserver would refuse, or that asks for something inferd does not do."""
    errors = []
    for flag in (*IGNORED, *INERT, *UNSUPPORTED):
        for value in getattr(args, _dest(flag)) or ():
            problem = value_error(flag, value)
            if problem is None and flag in UNSUPPORTED and value.strip().lower() not in UNSUPPORTED[flag][0]:
                problem = f"{flag}={value}: inferd does not support {UNSUPPORTED[flag][1]}"
            if problem is not None:
                errors.append(problem)
    return errors


def inert_given(args: argparse.Namespace) -> list[str]:
    """Start-up log lines: the ignored and inert flags on this command line and why they change nothing."""
    lines = []
    for flag, why in IGNORED.items():
        values: Any = getattr(args, _dest(flag))
        if values:
            lines.append(f"{flag}={','.join(values)} is ignored, as tritonserver ignores it {why}")
    for flag, why in INERT.items():
        values = getattr(args, _dest(flag))
        if values:
            lines.append(f"{flag}={','.join(values)} has no effect in inferd: {why}")
    return lines
