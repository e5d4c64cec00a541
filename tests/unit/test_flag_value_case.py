"""Enum-valued tritonserver flags read in any case where tritonserver lowercases them
(src/command_line_parser.cc 2.51: --model-control-mode, the trace mode and level), issue 43 item 10."""

from __future__ import annotations

import pytest
from inferd.supervisor.flags import parse_args
from inferd.supervisor.tracing.options import parse as parse_trace


def parse(tmp_path, *flags: str):
    return parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"), *flags], environ={})


@pytest.mark.parametrize("given,mode", [("POLL", "poll"), ("Explicit", "explicit"), ("NONE", "none"),
                                        ("poll", "poll")])
def test_model_control_mode_in_any_case(tmp_path, given, mode):
    """Triton's qa runs `--model-control-mode=POLL`; inferd stopped with "invalid choice: 'POLL'"."""
    assert parse(tmp_path, "--model-control-mode", given).model_control_mode == mode


def test_model_control_mode_still_refuses_other_values(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse(tmp_path, "--model-control-mode", "sometimes")
    assert "--model-control-mode" in capsys.readouterr().err


@pytest.mark.parametrize("value,level", [("max", ("TIMESTAMPS",)), ("MIN", ("TIMESTAMPS",)), ("on", ("TIMESTAMPS",)),
                                         ("True", ("TIMESTAMPS",)), ("false", ("OFF",)), ("Tensors", ("TENSORS",))])
def test_trace_level_aliases_as_tritonserver_reads_them(value, level):
    assert parse_trace([f"level={value}"]).level == level
    assert parse_trace([], level=[value]).level == level


def test_trace_mode_in_any_case():
    opts = parse_trace(["mode=OpenTelemetry", "OPENTELEMETRY,url=collector:4318/v1/traces", "TRITON,file=/t"])
    assert (opts.mode, opts.otel_url, opts.file) == ("opentelemetry", "collector:4318/v1/traces", "/t")


def test_unknown_trace_level_still_refused():
    with pytest.raises(ValueError, match="trace level LOUD"):
        parse_trace(["level=loud"])
