"""core/readiness.py: a version's readiness from its instances' is_ready() answers, and the words why not."""

from __future__ import annotations

from types import SimpleNamespace

from inferd.supervisor.core import readiness


class _Worker:
    def __init__(self, answer):
        self.readiness = object() if answer is not None else None
        self.answer = answer
        self.asked = 0

    async def check_ready(self):
        self.asked += 1
        return self.answer


def _version(*instances, state="READY"):
    ready = state == "READY" and any(i.ready for i in instances)
    return SimpleNamespace(state=state, reason="", instances=list(instances), ready=ready, name="m", version=1)


def _instance(name, ready=True, answer=(True, "")):
    return SimpleNamespace(name=name, ready=ready, worker=_Worker(answer))


async def test_every_ready_instance_is_asked_and_each_must_say_true():
    a, b = _instance("m_0_0"), _instance("m_0_1", answer=(False, ""))
    assert await readiness.version_ready(_version(a, b)) == (
        False, "Model 'm_0_1' is not ready (user-defined check failed).")
    assert a.worker.asked == 1 and b.worker.asked == 1


async def test_an_error_is_the_reason_and_instances_without_a_check_are_not_asked():
    plain = _instance("m_0_0", answer=None)
    failing = _instance("m_0_1", answer=(False, "RuntimeError: down"))
    assert await readiness.version_ready(_version(plain, failing)) == (False, "RuntimeError: down")
    assert plain.worker.asked == 0
    assert not readiness.asks_model(_version(_instance("x", answer=None)))


async def test_a_loaded_version_without_a_live_instance_names_it_as_triton_does():
    down = _instance("m_0_0", ready=False)
    assert await readiness.version_ready(_version(down)) == (False, "Stub process 'm_0_0' is not healthy.")
    assert down.worker.asked == 0
