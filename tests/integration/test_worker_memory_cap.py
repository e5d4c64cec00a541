"""The memory cap of an instance (instances/memory_cap.py) against real worker processes, enforced here by the
RSS watchdog (this host has no delegated cgroup v2): a worker that leaks past its cap is killed after the
batch that took it there, the error names the cap, the instance restarts with reason "memory" and the next
request succeeds; a worker under its cap is untouched; RLIMIT_DATA stops one huge allocation; a SIGKILL the
server did not send is reported as possibly the kernel's OOM killer."""

from __future__ import annotations

import dataclasses
import os
import re
import signal

import pytest
from inferd.supervisor.instances import cgroup_memory, memory_cap
from inferd.supervisor.instances.instance import InstanceState
from inferd.worker.wire.errors import InferdError

from .harness import TIMINGS, StateWatch, output, request, write_model

MiB = 1 << 20
CAP = 200 * MiB
CAPPED = dataclasses.replace(TIMINGS, memory_limit_bytes=CAP)

# INPUT0[0] = MiB to allocate and touch and keep (a leak); INPUT0[1] (optional) = MiB to allocate and drop
LEAK_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

KEPT = []

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().reshape(-1)
            try:
                KEPT.append(np.ones(int(x[0]) << 20, dtype=np.uint8))  # np.ones touches every page
                if x.size > 1:
                    np.ones(int(x[1]) << 20, dtype=np.uint8).sum()
            except MemoryError as exc:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("MemoryError: %s" % exc)))
                continue
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.astype(np.float32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            ]))
        return out
'''

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="the RSS watchdog reads /proc")


@pytest.fixture(autouse=True)
def _watchdog_here():
    if cgroup_memory.parent() is not None:
        pytest.skip("a delegated cgroup v2 enforces caps on this host, not the RSS watchdog")


async def test_a_leak_past_the_cap_is_replaced_and_the_next_request_succeeds(env):
    watch = StateWatch()
    inst = env.instance(write_model(env.models, "leaky", LEAK_MODEL), on_change=watch, timings=CAPPED)
    await inst.start()
    first = inst.pid
    assert memory_cap.private_rss(first) < CAP
    answered, failures = 0, []
    for _ in range(8):  # 50 MiB kept per request: past 200 MiB within 4 requests
        try:
            result = await inst.execute([request("leaky", [50])])
        except InferdError as exc:  # the heartbeat tick saw it mid-batch: only that batch fails
            failures.append(exc.message)
            break
        assert output(result.responses[0], "PID")[0] == first
        answered += 1
        if inst.state is not InstanceState.READY:  # killed after the batch that took it past the cap
            break
    # past the cap after the 4th (the 3rd with a large interpreter); one more where the look after a batch was
    # skipped (at most one per 20 ms) and the tick came only during the next
    assert 2 <= answered <= 5, (answered, failures)
    await watch.wait(inst, InstanceState.READY, timeout=20)
    assert inst.pid != first and inst.restarts == 1
    assert inst.restart_reasons == {"exit": 0, "signal": 0, "hung": 0, "memory": 1, "recycled": 0}
    message = inst.last_error.message
    assert re.fullmatch(r"model 'leaky' instance 'leaky_0' exceeded its memory limit of 200 MiB \(RSS (\d+) MiB\); "
                        rf"killed \(pid {first}\)", message), message
    assert int(re.search(r"RSS (\d+) MiB", message).group(1)) > 200
    assert all("exceeded its memory limit of 200 MiB" in f for f in failures)
    result = await inst.execute([request("leaky", [1])])
    assert output(result.responses[0], "PID")[0] == inst.pid


async def test_a_worker_under_its_cap_is_untouched(env):
    inst = env.instance(write_model(env.models, "steady", LEAK_MODEL), timings=CAPPED)
    await inst.start()
    pid = inst.pid
    for _ in range(6):  # 60 MiB allocated and dropped each time, 1 MiB kept: far below the cap
        result = await inst.execute([request("steady", [1, 60])])
        assert output(result.responses[0], "PID")[0] == pid
    assert inst.state is InstanceState.READY and inst.pid == pid and inst.restarts == 0


async def test_rlimit_data_stops_one_huge_allocation(env):
    inst = env.instance(write_model(env.models, "greedy", LEAK_MODEL), timings=CAPPED)
    await inst.start()
    pid = inst.pid
    limit = memory_cap.rlimit_data(CAP)
    with open(f"/proc/{pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max data size"))
    assert line.split()[3:5] == [str(limit), str(limit)]
    result = await inst.execute([request("greedy", [(limit >> 20) + 64])])  # refused before a page is touched
    assert isinstance(result.responses[0], InferdError) and "MemoryError" in result.responses[0].message
    result = await inst.execute([request("greedy", [1])])
    assert output(result.responses[0], "PID")[0] == pid and inst.restarts == 0


async def test_an_uncapped_worker_has_no_data_limit(env):
    inst = env.instance(write_model(env.models, "free", LEAK_MODEL))
    await inst.start()
    with open(f"/proc/{inst.pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max data size"))
    assert line.split()[3:5] == ["unlimited", "unlimited"]


async def test_a_sigkill_not_sent_by_the_server_is_reported_as_a_possible_oom_kill(env):
    watch = StateWatch()
    inst = env.instance(write_model(env.models, "victim", LEAK_MODEL), on_change=watch, timings=CAPPED)
    await inst.start()
    victim = inst.pid
    os.kill(victim, signal.SIGKILL)
    await watch.wait(inst, InstanceState.RESTARTING, timeout=10)
    assert inst.last_error.message == (f"model 'victim' instance 'victim_0' (pid {victim}) died: killed by signal 9 "
                                       "(SIGKILL), possibly by the kernel's OOM killer")
    await watch.wait(inst, InstanceState.READY, timeout=20)
    assert inst.restart_reasons["signal"] == 1 and inst.restart_reasons["memory"] == 0


async def test_a_model_whose_initialize_alone_passes_the_cap_fails_its_load_naming_the_cap(env):
    source = LEAK_MODEL.replace("class TritonPythonModel:\n", "class TritonPythonModel:\n"
                                "    def initialize(self, args):\n"
                                "        KEPT.append(np.ones(260 << 20, dtype=np.uint8))\n\n")
    # heartbeat ticks 5 s apart: none during initialize(), the look once it returned finds it
    inst = env.instance(write_model(env.models, "bloated", source),
                        timings=dataclasses.replace(CAPPED, heartbeat_interval_s=5.0))
    with pytest.raises(InferdError) as info:
        await inst.start()
    assert re.fullmatch(r"model 'bloated' instance 'bloated_0' exceeded its memory limit of 200 MiB \(RSS \d+ MiB\)"
                        r" after loading the model", info.value.message), info.value.message
    assert inst.state is InstanceState.FAILED and inst.pid is None
