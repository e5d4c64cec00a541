"""Batch forming rules (scheduler.batching): sizes, preferred sizes, queue delay, must-match shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.scheduler.batching import BatchRules, Decision, form_batch

MS = 1_000_000


@dataclass
class Item:
    items: int = 1
    key: Any = None
    arrival_ns: int = 0


def rules(max_batch_size: int = 8, preferred: tuple[int, ...] = (), delay_us: int = 0,
          inputs: list[dict] | None = None) -> BatchRules:
    config = {"max_batch_size": max_batch_size,
              "dynamic_batching": {"preferred_batch_size": list(preferred), "max_queue_delay_microseconds": delay_us},
              "input": inputs or [{"name": "X", "dims": [4]}]}
    return BatchRules.from_config(config)


def test_no_delay_sends_everything_pending_up_to_max():
    r = rules(max_batch_size=8)
    assert form_batch(r, [Item()] * 3, now_ns=0, busy=False) == Decision(3)
    assert form_batch(r, [Item()] * 11, now_ns=0, busy=False) == Decision(8)
    assert form_batch(r, [], now_ns=0, busy=False) == Decision(0)


def test_batch_items_count_dim0_and_never_pass_max():
    r = rules(max_batch_size=8)
    queue = [Item(items=3), Item(items=3), Item(items=3)]
    assert form_batch(r, queue, now_ns=0, busy=False) == Decision(2)  # 6 items; 9 would pass 8
    assert form_batch(r, [Item(items=8), Item()], now_ns=0, busy=True) == Decision(1)


def test_delay_waits_for_the_oldest_request_then_sends():
    r = rules(max_batch_size=8, delay_us=1000)
    queue = [Item(arrival_ns=10 * MS), Item(arrival_ns=10 * MS + 5)]
    assert form_batch(r, queue, now_ns=10 * MS + 100, busy=False) == Decision(0, 11 * MS)
    assert form_batch(r, queue, now_ns=11 * MS, busy=False) == Decision(2)


def test_full_batch_goes_at_once_despite_delay():
    r = rules(max_batch_size=4, delay_us=10_000_000)
    assert form_batch(r, [Item()] * 4, now_ns=0, busy=False) == Decision(4)


def test_largest_preferred_prefix_is_sent_without_waiting():
    r = rules(max_batch_size=16, preferred=(2, 4), delay_us=10_000_000)
    assert form_batch(r, [Item()] * 3, now_ns=0, busy=False) == Decision(2)
    assert form_batch(r, [Item()] * 7, now_ns=0, busy=False) == Decision(4)
    assert form_batch(r, [Item()], now_ns=0, busy=False) == Decision(0, 10_000_000_000)


def test_shape_mismatch_ends_the_batch_and_sends_it():
    r = rules(max_batch_size=8, delay_us=10_000_000)
    queue = [Item(key="a"), Item(key="a"), Item(key="b"), Item(key="a")]
    assert form_batch(r, queue, now_ns=0, busy=False) == Decision(2)
    assert form_batch(r, queue[2:], now_ns=0, busy=False) == Decision(1)


def test_busy_instance_takes_only_batches_that_cannot_improve():
    r = rules(max_batch_size=4, preferred=(2, 4))
    assert form_batch(r, [Item()], now_ns=0, busy=True) == Decision(0)  # would grow by waiting
    assert form_batch(r, [Item()] * 3, now_ns=0, busy=True) == Decision(2)  # a preferred size
    assert form_batch(r, [Item()] * 4, now_ns=0, busy=True) == Decision(4)
    r1 = rules(max_batch_size=0)  # no batching: every request is a full batch
    assert form_batch(r1, [Item(), Item()], now_ns=0, busy=True) == Decision(1)


def _request(*tensors: tuple[str, list[int]]) -> InferRequest:
    return InferRequest("m", inputs=[Tensor(name, "FP32", shape, b"") for name, shape in tensors])


def test_must_match_inputs_are_variable_non_ragged_ones():
    r = rules(inputs=[{"name": "FIXED", "dims": [4]}, {"name": "VAR", "dims": [-1]},
                      {"name": "RAGGED", "dims": [-1], "allow_ragged_batch": True}])
    assert r.must_match == frozenset({"VAR"})
    a = r.key_of(_request(("FIXED", [1, 4]), ("VAR", [1, 3]), ("RAGGED", [1, 5])))
    b = r.key_of(_request(("FIXED", [2, 4]), ("VAR", [2, 3]), ("RAGGED", [2, 9])))
    c = r.key_of(_request(("FIXED", [1, 4]), ("VAR", [1, 2]), ("RAGGED", [1, 5])))
    assert a == b  # dim 0 (the batch) and ragged inputs do not matter
    assert a != c
    assert rules().key_of(_request(("X", [3, 4]))) is None  # nothing to match: any request fits


def test_optional_input_presence_must_match():
    r = rules(inputs=[{"name": "X", "dims": [4]}, {"name": "OPT", "dims": [4], "optional": True}])
    assert r.key_of(_request(("X", [1, 4]))) != r.key_of(_request(("X", [1, 4]), ("OPT", [1, 4])))


def test_items_of_uses_dim0_only_for_batching_models():
    assert rules(max_batch_size=8).items_of(_request(("X", [5, 4]))) == 5
    assert rules(max_batch_size=8).items_of(_request(("X", [0, 4]))) == 1
    assert rules(max_batch_size=0).items_of(_request(("X", [5, 4]))) == 1


def test_default_preferred_is_max_batch_size():
    r = rules(max_batch_size=8, delay_us=5)
    assert r.max_preferred == 8 and r.delay_ns == 5000


def test_once_the_delay_ran_out_everything_walked_goes_not_just_the_preferred_prefix():
    r = rules(max_batch_size=16, preferred=(4,), delay_us=1000)
    queue = [Item(arrival_ns=0)] * 6
    assert form_batch(r, queue, now_ns=999_999, busy=False) == Decision(4)
    assert form_batch(r, queue, now_ns=1_000_000, busy=False) == Decision(6)


def test_prefix_before_passing_the_largest_preferred_size_is_sent():
    r = rules(max_batch_size=16, preferred=(4,), delay_us=10_000_000)
    assert form_batch(r, [Item(items=3), Item(items=3)], now_ns=0, busy=True) == Decision(1)


def test_plain_walk_decides_as_the_general_one():
    """form_batch's short walk for configs without preferred sizes gives the general walk's decision."""
    import random

    from inferd.supervisor.scheduler.batching import _form_general, _form_plain

    rng = random.Random(25)
    for _ in range(3000):
        r = rules(max_batch_size=rng.choice([1, 4, 8]), delay_us=rng.choice([0, 1000]))
        queue = [Item(items=rng.choice([1, 1, 1, 2, 5, 9]), key=rng.choice([None, None, None, "b"]),
                      arrival_ns=rng.randrange(0, 3 * MS)) for _ in range(rng.randrange(0, 12))]
        now, busy = rng.randrange(0, 4 * MS), rng.random() < 0.5
        assert _form_plain(r, queue, now, busy) == _form_general(r, queue, now, busy), (r, queue, now, busy)
