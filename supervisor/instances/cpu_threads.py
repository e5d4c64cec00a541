"""The thread-count environment of a worker whose CPUs are fewer than the host's (issue 41 item 3).

OpenMP, OpenBLAS, MKL, numexpr and Accelerate size their thread pools from the host's CPU count when
nothing says otherwise, not from the process's affinity: two instances pinned to 2 cores each of a
64-core host would each start 64 threads and fight over their 2 cores. So a worker that runs on fewer
CPUs than the host has (a --host-policy, or a server started under taskset / in a cpuset) gets each of
these variables set to its CPU count, unless its environment (the server's, or the model's execution
environment) already sets it: a value the user chose stays. torch reads OMP_NUM_THREADS / MKL_NUM_THREADS
at import; ONNX Runtime reads none of them, so the worker's onnxruntime backend sizes its intra-op pool
from the affinity itself (worker/backends/framework.py `cpu_threads`), unless the model's
`intra_op_thread_count` parameter says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS")


def worker_cpus(pinned: frozenset[int] | None) -> frozenset[int]:
    """The CPUs a worker will run on: those of its policy that this server may use (the kernel keeps a
    worker within the server's own set), else the server's own, which the worker inherits."""
    own = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    if pinned is None:
        return own
    return (pinned & own) or pinned


def thread_defaults(cpus: frozenset[int], env: Mapping[str, str], host_cpus: int | None = None) -> dict[str, str]:
    """The variables to add to `env` for a worker on `cpus`: none when it has every CPU of the host (or the
    count is unknown), else each of THREAD_VARS that `env` does not set, as the number of CPUs."""
    host = os.cpu_count() if host_cpus is None else host_cpus
    if not cpus or not host or len(cpus) >= host:
        return {}
    count = str(len(cpus))
    return {name: count for name in THREAD_VARS if name not in env}
