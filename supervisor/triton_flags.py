"""tritonserver flags inferd takes without implementing them, so a Triton command line starts inferd
unchanged, and the values it refuses rather than run otherwise than the command line says.

The flags inferd implements are in flags.py. Those below tune machinery inferd does not have (thread
pools, memory pools, a backend directory...) or feed integrations it does not carry: they are accepted
with any value and named once in the start-up log. A value that asks for behaviour inferd lacks (model
namespacing, SageMaker...) stops the start with an error naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

# flag -> why it changes nothing in inferd
INERT: dict[str, str] = {
    "--http-thread-count": "the supervisor's event loop serves HTTP",
    "--grpc-infer-thread-count": "the supervisor's event loop serves gRPC",  # earlier tritonserver releases
    "--grpc-infer-allocation-pool-size": "no response allocation pool",
    "--buffer-manager-thread-count": "tensors travel through shared memory, no buffer manager threads",
    "--pinned-memory-pool-byte-size": "no pinned memory pool",
    "--cuda-memory-pool-byte-size": "no CUDA memory pool in the supervisor",
    "--cuda-virtual-address-size": "no CUDA virtual address reservation",
    "--backend-directory": "the backends are built in",
    "--backend-config": "backend settings of Triton's backends",
    "--host-policy": "no host policies",
    "--min-supported-compute-capability": "GPU models run in their worker's framework",
    "--enable-peer-access": "GPU models run in their worker's framework",
    "--model-load-gpu-limit": "no GPU memory limit on loading",
    "--model-load-thread-count": "models load concurrently on the event loop",
    "--sagemaker-port": "no SageMaker endpoint",
    "--sagemaker-safe-port-range": "no SageMaker endpoint",
    "--sagemaker-thread-count": "no SageMaker endpoint",
    "--vertex-ai-port": "no Vertex AI endpoint",
    "--vertex-ai-thread-count": "no Vertex AI endpoint",
    "--vertex-ai-default-model": "no Vertex AI endpoint",
    "--grpc-infer-response-compression-level": "gRPC responses are sent uncompressed",
}

# flag -> (the values inferd runs as asked, what the other values would need)
UNSUPPORTED: dict[str, tuple[tuple[str, ...], str]] = {
    "--model-namespacing": (("false", "0", "no", "off"), "models of the same name in different repositories"),
    "--allow-sagemaker": (("false", "0", "no", "off"), "a SageMaker endpoint"),
    "--allow-vertex-ai": (("false", "0", "no", "off"), "a Vertex AI endpoint"),
}


def _dest(flag: str) -> str:
    return "triton_" + flag.lstrip("-").replace("-", "_")


def add_to(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tritonserver flags accepted for compatibility")
    for flag, why in INERT.items():
        group.add_argument(flag, dest=_dest(flag), action="append", metavar="VALUE",
                           help=f"no effect: {why}")
    for flag, (ok, needs) in UNSUPPORTED.items():
        allowed = f" (only {ok[0]} is accepted)" if ok else ""
        group.add_argument(flag, dest=_dest(flag), action="append", metavar="VALUE",
                           help=f"would need {needs}, which inferd does not have{allowed}")


def refusals(args: argparse.Namespace) -> list[str]:
    """An error line per flag whose value asks for something inferd does not do."""
    errors = []
    for flag, (ok, needs) in UNSUPPORTED.items():
        for value in getattr(args, _dest(flag)) or ():
            if value.strip().lower() not in ok:
                errors.append(f"{flag}={value}: inferd does not support {needs}")
    return errors


def inert_given(args: argparse.Namespace) -> list[str]:
    """Start-up log lines: the inert flags on this command line and why they change nothing."""
    lines = []
    for flag, why in INERT.items():
        values: Any = getattr(args, _dest(flag))
        if values:
            lines.append(f"{flag}={','.join(values)} has no effect in inferd: {why}")
    return lines
