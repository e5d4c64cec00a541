"""The Prometheus text exposition format (0.0.4) as prometheus-cpp, under Triton, writes it: the media type,
label escaping, sample values, bucket bounds, and a family's HELP/TYPE header followed by its samples.

Written by hand rather than through prometheus_client: prometheus_client would rename every counter
``<name>_total``, which breaks Triton's names, and a hand-built scrape is an order of magnitude cheaper than a
prometheus_client Collector. (Custom metrics of Python models keep their own value format: metrics/custom.py.)
"""

from __future__ import annotations

from collections.abc import Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # of every /metrics answer


def escape(value: str) -> str:
    """A label value with backslash, double quote and newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def fmt(value: float) -> str:
    """A sample value: ints as they are, floats by repr, NaN and +Inf/-Inf by name."""
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def le(bound: float) -> str:
    """A bucket bound as prometheus-cpp writes it (%.16g, +Inf)."""
    return "+Inf" if bound == float("inf") else "%.16g" % bound


class Family:
    """Lines of one metric family; written only when it has samples."""

    __slots__ = ("name", "lines")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def add(self, labels: str, value: float) -> None:
        self.lines.append(f"{self.name}{{{labels}}} {fmt(value)}")

    def add_plain(self, value: float) -> None:
        self.lines.append(f"{self.name} {fmt(value)}")


def encode(families: Iterable[Family]) -> bytes:
    """The families' lines, one after the other, ending in a newline."""
    lines: list[str] = []
    for fam in families:
        lines += fam.lines
    lines.append("")
    return "\n".join(lines).encode()
