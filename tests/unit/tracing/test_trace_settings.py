"""TraceSettings parses values as Triton 2.51 does (answers recorded from the real server)."""

import pytest
from inferd.supervisor.tracing.settings import TraceSettings
from inferd.worker.wire.errors import ErrorCode, InferdError


def test_values_are_read_as_stoi_reads_them():
    t = TraceSettings()
    t.update("m", {"trace_count": "5x", "log_frequency": "-1", "trace_rate": "0"})
    assert t.get("m") == {"trace_level": ["OFF"], "trace_rate": "0", "trace_count": "5",
                          "log_frequency": "4294967295", "trace_file": "", "trace_mode": "triton"}
    assert t.get()["trace_rate"] == "1000"


@pytest.mark.parametrize("update, message", [
    ({"trace_rate": "99999999999"},
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"),
    ({"trace_count": "9" * 5000}, "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: "
     + "9" * 5000),
    ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
    ({"trace_rate": ["1", "2"]}, "expect only 1 value for 'trace_rate'"),
    ({"trace_rate": 5}, "'trace_rate' must be a string, got 5"),
    ({"trace_level": "TIMESTAMPS"}, "'trace_level' must be an array of strings"),
])
def test_refusals(update, message):
    t = TraceSettings()
    with pytest.raises(InferdError) as err:
        t.update("", update)
    assert err.value.code == ErrorCode.INVALID_ARG and err.value.message == message
    assert t.get() == TraceSettings().get()


def test_unknown_levels_and_keys_change_nothing():
    t = TraceSettings()
    t.update("m", {"trace_level": ["BOGUS"], "trace_mode": "opentelemetry", "bogus": "1"})
    t.update("m", {"trace_level": []})
    assert t.get("m") == TraceSettings().get()


def test_model_override_ends_when_its_last_field_is_cleared():
    t = TraceSettings()
    t.update("m", {"trace_rate": "5"})
    t.update("", {"trace_rate": "7"})
    assert t.get("m")["trace_rate"] == "5"
    t.update("m", {"trace_rate": None})
    assert t.get("m")["trace_rate"] == "7"
    assert t.effective("m") == t.effective()


def test_tracing_is_on_only_where_a_trace_can_be_written():
    from inferd.supervisor.tracing.settings import TraceSettings as Settings

    on = {"trace_level": ("TIMESTAMPS",), "trace_file": "/tmp/t.json"}
    assert not Settings().any_on()
    assert not Settings(defaults={"trace_level": ("TIMESTAMPS",)}).any_on()  # triton mode without a file
    assert Settings(defaults={"trace_level": ("TIMESTAMPS",)}, mode="opentelemetry").any_on()
    assert Settings(defaults=on).any_on()
    assert not Settings(defaults={**on, "trace_count": 0}).any_on()
    one_model = Settings(defaults={"trace_file": "/tmp/t.json"})
    one_model.update("m", {"trace_level": ["TIMESTAMPS"]})
    assert one_model.any_on() and one_model.owner("m") == "m" and one_model.owner("other") == ""
    counted = Settings(defaults={**on, "trace_count": 2})
    counted.count_down("m")
    assert counted.get()["trace_count"] == "1"
