"""--trace-config and the deprecated --trace-* flags read as tritonserver 2.51 reads them; what it refuses."""

from __future__ import annotations

import pytest
from inferd.supervisor.flags import parse_args
from inferd.supervisor.tracing.options import OTEL_DEFAULT_URL, TraceOptions, parse


def test_defaults_trace_nothing():
    assert parse([]) == TraceOptions()
    assert TraceOptions().level == ("OFF",) and TraceOptions().rate == 1000 and TraceOptions().count == -1


def test_triton_mode_settings():
    opts = parse(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100", "level=TIMESTAMPS",
                  "level=TENSORS", "count=100"])
    assert opts == TraceOptions(level=("TIMESTAMPS", "TENSORS"), rate=100, count=100, file="/tmp/t.json",
                                log_frequency=50)


def test_deprecated_flags_and_the_last_value_wins():
    opts = parse(["rate=5"], file=["/tmp/a"], level=["timestamps"], rate=["7"], count=["3"], log_frequency=["2"])
    assert (opts.file, opts.level, opts.rate, opts.count, opts.log_frequency) == ("/tmp/a", ("TIMESTAMPS",), 5, 3, 2)
    assert parse(["level=TIMESTAMPS", "level=OFF"], file=["/x"]).level == ("TIMESTAMPS",)


def test_opentelemetry_settings():
    opts = parse(["mode=opentelemetry", "level=TIMESTAMPS", "rate=0", "opentelemetry,url=collector:4318/v1/traces",
                  "opentelemetry,resource=service.name=inferd", "opentelemetry,resource=deployment=test",
                  "opentelemetry,bsp_schedule_delay=100", "opentelemetry,bsp_max_queue_size=10",
                  "opentelemetry,bsp_max_export_batch_size=5"])
    assert opts.mode == "opentelemetry" and opts.rate == 0
    assert opts.otel_url == "collector:4318/v1/traces"  # shown as given, as Triton shows it
    assert dict(opts.otel_resource) == {"service.name": "inferd", "deployment": "test"}
    assert (opts.bsp_schedule_delay_ms, opts.bsp_max_queue_size, opts.bsp_max_export_batch_size) == (100, 10, 5)
    assert parse(["mode=opentelemetry"]).otel_url == OTEL_DEFAULT_URL


@pytest.mark.parametrize("values, text", [
    (["level=LOUD", "triton,file=/x"], "trace level LOUD"),
    (["rate=-1"], "expected a value >= 0"),
    (["count=-2"], "expected a value >= -1"),
    (["rate=often"], "expected an integer"),
    (["mode=jaeger"], "triton or opentelemetry"),
    (["zipkin,url=x"], "unknown trace mode 'zipkin'"),
    (["triton,url=x"], "unknown triton trace setting 'url'"),
    (["frequency=2"], "unknown global trace setting 'frequency'"),
    (["rate"], "expected [<mode>,]<setting>=<value>"),
    (["mode=opentelemetry", "level=TENSORS"], "does not support the TENSORS level"),
    (["opentelemetry,resource=novalue"], "expected resource=<key>=<value>"),
    (["opentelemetry,bsp_max_queue_size=4", "opentelemetry,bsp_max_export_batch_size=8"], "must not exceed"),
])
def test_refused_values_name_the_problem(values, text):
    with pytest.raises(ValueError) as err:
        parse(values)
    assert text in str(err.value)


def test_config_carries_the_options_with_an_absolute_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse_args(["--model-repository", str(tmp_path), "--trace-config", "triton,file=t.json",
                      "--trace-level", "TIMESTAMPS", "--trace-rate", "1"], environ={})
    assert cfg.trace == TraceOptions(level=("TIMESTAMPS",), rate=1, file=str(tmp_path / "t.json"))
    # as tritonserver 2.51: a level without a file starts (and writes nothing); the start-up log says so
    cfg = parse_args(["--model-repository", str(tmp_path), "--trace-config", "level=TIMESTAMPS"], environ={})
    assert cfg.trace.level == ("TIMESTAMPS",) and not cfg.trace.file
    assert any("no traces are written" in line for line in cfg.inert_flags)
