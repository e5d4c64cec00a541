"""Response cache: flag parsing, which models use it, the request key, and the byte-bounded LRU."""

from __future__ import annotations

import pytest
from inferd.supervisor import flags
from inferd.supervisor.inference.types import (
    SEQUENCE_START,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)
from inferd.supervisor.metrics.server_families import CacheMetrics, render_cache_metrics
from inferd.supervisor.response_cache import (
    ENTRY_OVERHEAD,
    TENSOR_OVERHEAD,
    ResponseCache,
    model_wants_cache,
    parse_cache_config,
    request_key,
)

# ---- --cache-config ----


def test_parse_local_size() -> None:
    settings = parse_cache_config(["local,size=1048576"])
    assert settings is not None and settings.size_bytes == 1048576


def test_parse_no_flag_means_no_cache() -> None:
    assert parse_cache_config([]) is None


def test_parse_repeated_flags_last_size_wins() -> None:
    settings = parse_cache_config(["local,size=10", "local,size=20"])
    assert settings is not None and settings.size_bytes == 20


@pytest.mark.parametrize("values, words", [
    (["redis,host=localhost"], "'redis' is not supported"),
    (["local,bytes=10"], "unknown setting 'bytes'"),
    (["local,size=ten"], "whole number"),
    (["local,size=-1"], "must not be negative"),
    (["local"], "<cache_name>,<key>=<value>"),
    (["local,size"], "<cache_name>,<key>=<value>"),
])
def test_parse_errors_name_the_problem(values: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_cache_config(values)


def test_server_flag(tmp_path) -> None:
    cfg = flags.parse_args(["--model-repository", str(tmp_path), "--cache-config", "local,size=4096",
                                 "--run-dir", str(tmp_path / "run")])
    assert cfg.response_cache_bytes == 4096
    cfg = flags.parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run")])
    assert cfg.response_cache_bytes is None
    cfg = flags.parse_args(["--model-repository", str(tmp_path), "--response-cache-byte-size", "512",
                                 "--cache-directory", "/opt/tritonserver/caches", "--run-dir", str(tmp_path / "run")])
    assert cfg.response_cache_bytes == 512
    with pytest.raises(SystemExit, match="not supported"):
        flags.parse_args(["--model-repository", str(tmp_path), "--cache-config", "redis,host=x",
                               "--run-dir", str(tmp_path / "run")])


# ---- which models ----


def test_model_wants_cache() -> None:
    assert model_wants_cache({"response_cache": {"enable": True}})
    assert not model_wants_cache({"response_cache": {"enable": False}})
    assert not model_wants_cache({})
    assert not model_wants_cache({"response_cache": {"enable": True},
                                  "model_transaction_policy": {"decoupled": True}})
    assert not model_wants_cache({"response_cache": {"enable": True}, "sequence_batching": {"direct": {}}})


# ---- the key ----


def _request(data: bytes = b"\x01\x02\x03\x04", **kw) -> InferRequest:
    req = InferRequest("m", id="req-1", inputs=[Tensor("INPUT0", "UINT8", [4], data)])
    for name, value in kw.items():
        setattr(req, name, value)
    return req


def test_same_request_same_key_whatever_the_id_and_buffer_type() -> None:
    a = _request()
    b = _request(memoryview(bytearray(b"\x01\x02\x03\x04")), id="another-id")
    assert request_key(1, a) == request_key(1, b)


def test_input_order_does_not_matter() -> None:
    x, y = Tensor("A", "UINT8", [1], b"\x01"), Tensor("B", "UINT8", [1], b"\x02")
    assert request_key(1, InferRequest("m", inputs=[x, y])) == request_key(1, InferRequest("m", inputs=[y, x]))


@pytest.mark.parametrize("change", [
    "data", "shape", "datatype", "name", "model", "generation", "output", "classification", "parameter",
    "input_parameter",
])
def test_what_changes_the_answer_changes_the_key(change: str) -> None:
    base = _request()
    other = _request()
    generation = 1
    if change == "data":
        other.inputs[0].data = b"\x01\x02\x03\x05"
    elif change == "shape":
        other.inputs[0].shape = [2, 2]
    elif change == "datatype":
        other.inputs[0].datatype = "INT8"
    elif change == "name":
        other.inputs[0].name = "INPUT1"
    elif change == "model":
        other.model_name = "m2"
    elif change == "generation":
        generation = 2
    elif change == "output":
        other.outputs = [RequestedOutput("OUTPUT0")]
    elif change == "classification":
        base.outputs = [RequestedOutput("OUTPUT0")]
        other.outputs = [RequestedOutput("OUTPUT0", {"classification": 2})]
    elif change == "parameter":
        other.parameters = {"temperature": 0.5}
    elif change == "input_parameter":
        other.inputs[0].parameters = {"custom": 1}
    assert request_key(1, base) != request_key(generation, other)


def test_transport_details_do_not_change_the_key() -> None:
    a = _request(outputs=[RequestedOutput("OUTPUT0")])
    b = _request(outputs=[RequestedOutput("OUTPUT0", {"binary_data": True, "shared_memory_region": "r",
                                                      "shared_memory_byte_size": 16})])
    assert request_key(1, a) == request_key(1, b)


def test_field_boundaries_are_unambiguous() -> None:
    a = InferRequest("m", inputs=[Tensor("AB", "UINT8", [1], b"\x01")])
    b = InferRequest("m", inputs=[Tensor("A", "UINT8", [1], b"B\x01")])
    assert request_key(1, a) != request_key(1, b)


def test_sequence_requests_are_never_cached() -> None:
    assert request_key(1, _request(correlation_id=7)) is None
    assert request_key(1, _request(correlation_id="abc")) is None
    assert request_key(1, _request(flags=SEQUENCE_START)) is None


# ---- the LRU ----


def _response(nbytes: int, fill: int = 0) -> InferResponse:
    return InferResponse("m", "1", "id", [Tensor("OUTPUT0", "UINT8", [nbytes], bytearray([fill]) * nbytes)],
                         {"p": 1})


def _size(nbytes: int) -> int:
    return ENTRY_OVERHEAD + TENSOR_OVERHEAD + nbytes


def test_hit_returns_fresh_objects_over_an_immutable_copy() -> None:
    cache = ResponseCache(1 << 20)
    original = _response(8, fill=7)
    assert cache.insert(b"k", original)
    original.outputs[0].data[0] = 99  # the worker frame is reused / the client buffer changes
    hit = cache.lookup(b"k", "m", "1", "new-id")
    assert hit is not None and hit.id == "new-id"
    assert bytes(hit.outputs[0].data) == bytes([7]) * 8
    assert isinstance(hit.outputs[0].data, bytes)
    # a frontend that edits the response it got must not change the next hit
    hit.parameters["triton_final_response"] = True
    hit.outputs[0].shape.append(1)
    hit.outputs[0].parameters["x"] = 1
    hit.outputs.clear()
    again = cache.lookup(b"k", "m", "1", "id3")
    assert again is not None and again.parameters == {"p": 1}
    assert again.outputs[0].shape == [8] and again.outputs[0].parameters == {}
    assert cache.hits == 2 and cache.misses == 0


def test_miss_counts() -> None:
    cache = ResponseCache(1 << 20)
    assert cache.lookup(b"nope", "m", "1", "") is None
    assert cache.misses == 1 and cache.hits == 0


def test_lru_evicts_least_recently_used_by_bytes() -> None:
    cache = ResponseCache(3 * _size(100))
    for key in (b"a", b"b", b"c"):
        assert cache.insert(key, _response(100))
    assert cache.used_bytes == 3 * _size(100)
    assert cache.lookup(b"a", "m", "1", "") is not None  # a is now the most recent
    assert cache.insert(b"d", _response(100))
    assert cache.lookup(b"b", "m", "1", "") is None  # b was the oldest
    assert all(cache.lookup(k, "m", "1", "") is not None for k in (b"a", b"c", b"d"))
    assert cache.evictions == 1 and len(cache) == 3
    assert cache.used_bytes <= cache.max_bytes


def test_a_big_entry_evicts_as_many_as_needed() -> None:
    cache = ResponseCache(4 * _size(100))
    for key in (b"a", b"b", b"c", b"d"):
        cache.insert(key, _response(100))
    assert cache.insert(b"big", _response(2 * _size(100)))
    # the big one is 2 entries' worth plus its own overhead: the three oldest go, the newest stays
    assert cache.evictions == 3 and len(cache) == 2
    assert cache.lookup(b"d", "m", "1", "") is not None and cache.lookup(b"c", "m", "1", "") is None
    assert cache.used_bytes <= cache.max_bytes


def test_entry_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(_size(100))
    assert cache.insert(b"a", _response(100))
    assert not cache.insert(b"b", _response(101))
    assert cache.lookup(b"a", "m", "1", "") is not None  # nothing was evicted for it
    assert cache.lookup(b"b", "m", "1", "") is None


def test_zero_size_cache_stores_nothing() -> None:
    cache = ResponseCache(0)
    assert not cache.insert(b"a", _response(1))
    assert len(cache) == 0 and cache.utilization() == 0.0


def test_reinserting_a_key_replaces_it_without_leaking_bytes() -> None:
    cache = ResponseCache(1 << 20)
    cache.insert(b"a", _response(100))
    cache.insert(b"a", _response(10))
    assert cache.used_bytes == _size(10) and len(cache) == 1


def test_cache_gauges_text() -> None:
    text = render_cache_metrics(CacheMetrics(0.25, 3, 5, 2, 1, 7000, 3000)).decode()
    assert "# TYPE nv_cache_util gauge\nnv_cache_util 0.25\n" in text
    assert "nv_cache_num_entries 3\n" in text
    assert "nv_cache_num_hits 5\n" in text and "nv_cache_num_misses 2\n" in text
    assert "nv_cache_num_lookups 7\n" in text and "nv_cache_num_evictions 1\n" in text
    assert "nv_cache_lookup_duration 7\n" in text and "nv_cache_insertion_duration 3\n" in text
