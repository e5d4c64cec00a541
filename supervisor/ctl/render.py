"""Human output: aligned tables and the per-command views built from the server's JSON."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    text = str(value)
    return text.splitlines()[0] if text.strip() else "-"


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Columns padded to their widest cell; numeric columns right-aligned; no trailing spaces."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    right = [
        bool(cells) and all(_numeric(row[i]) or row[i] == "-" for row in cells)
        and any(row[i] != "-" for row in cells)
        for i in range(len(headers))
    ]
    lines = []
    for row in [list(headers), *cells]:  # a numeric column's header is right-aligned too
        parts = [t.rjust(w) if r else t.ljust(w) for t, w, r in zip(row, widths, right, strict=True)]
        lines.append((indent + "  ".join(parts)).rstrip())
    return "\n".join(lines)


def index_view(entries: list[dict[str, Any]]) -> str:
    if not entries:
        return "(no models)"
    rows = [[e.get("name"), e.get("version"), e.get("state"), e.get("reason")] for e in entries]
    return table(["NAME", "VERSION", "STATE", "REASON"], rows)


def status_view(doc: dict[str, Any]) -> str:
    models = doc.get("models") or []
    if not models:
        return "(no models)"
    blocks = []
    for m in models:
        head = str(m.get("name"))
        if m.get("version"):
            head += f" (version {m['version']})"
        head += ": %s" % (m.get("state") or "UNKNOWN")
        if m.get("reason"):
            head += " - " + cell(m["reason"])
        lines = [head]
        instances = m.get("instances")
        if instances is None:
            pass  # index fallback: the server did not say
        elif not instances:
            lines.append("  (no instances)")
        else:
            with_uptime = any("uptime_s" in i for i in instances)
            with_limit = any(i.get("memory_limit") for i in instances)
            headers = ["INSTANCE", "PID", "STATE", "RESTARTS", "INFLIGHT"]
            if with_uptime:
                headers.append("UPTIME")
            if with_limit:
                headers.append("MEMORY LIMIT")
            headers.append("LAST ERROR")
            rows = []
            for i in instances:
                row = [i.get("name"), i.get("pid"), i.get("state"), restarts(i), i.get("inflight")]
                if with_uptime:
                    row.append(duration(i.get("uptime_s")))
                if with_limit:
                    row.append(mib(i.get("memory_limit")))
                row.append(i.get("last_error"))
                rows.append(row)
            lines.append(table(headers, rows, indent="  "))
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def restarts(instance: dict[str, Any]) -> str:
    """'3 (memory 2, hung 1)': the count, and why the workers before ended where the server says."""
    count = instance.get("restarts")
    reasons = instance.get("restart_reasons")
    why = ", ".join(f"{k} {v}" for k, v in reasons.items() if v) if isinstance(reasons, dict) else ""
    return f"{count} ({why})" if why else str(count)


def mib(size: Any) -> str:
    return f"{size / (1 << 20):.0f} MiB" if isinstance(size, int) and size > 0 else "-"


def duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    hours, rest = divmod(seconds, 3600)
    if hours < 48:
        return f"{hours}h{rest // 60:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def _avg_us(stat: dict[str, Any] | None, count: int | None = None) -> float | None:
    if not stat:
        return None
    n = stat.get("count", 0) if count is None else count
    return stat.get("ns", 0) / n / 1000.0 if n else None


def _when(ms: Any) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000.0))


def stats_view(doc: dict[str, Any]) -> str:
    entries = doc.get("model_stats") or []
    if not entries:
        return "(no statistics: no model loaded)"
    rows = []
    for e in entries:
        st = e.get("inference_stats") or {}
        compute_n = (st.get("compute_infer") or {}).get("count", 0)
        compute_ns = sum((st.get(k) or {}).get("ns", 0) for k in ("compute_input", "compute_infer",
                                                                    "compute_output"))
        rows.append([
            e.get("name"),
            e.get("version"),
            (st.get("success") or {}).get("count", 0),
            (st.get("fail") or {}).get("count", 0),
            e.get("inference_count", 0),
            e.get("execution_count", 0),
            _avg_us(st.get("success")),
            _avg_us(st.get("queue")),
            compute_ns / compute_n / 1000.0 if compute_n else None,
            (st.get("cache_hit") or {}).get("count", 0),
            _when(e.get("last_inference")),
        ])
    headers = ["MODEL", "VERSION", "SUCCESS", "FAIL", "INFERENCES", "EXECUTIONS", "AVG REQUEST US",
               "AVG QUEUE US", "AVG COMPUTE US", "CACHE HITS", "LAST INFERENCE"]
    return table(headers, rows)


def metadata_view(doc: dict[str, Any]) -> str:
    lines = [
        f"name:     {cell(doc.get('name'))}",
        "versions: %s" % (", ".join(str(v) for v in doc.get("versions") or []) or "-"),
        f"platform: {cell(doc.get('platform'))}",
        "",
    ]
    rows = [["input", t.get("name"), t.get("datatype"), t.get("shape")] for t in doc.get("inputs") or []]
    rows += [["output", t.get("name"), t.get("datatype"), t.get("shape")] for t in doc.get("outputs") or []]
    lines.append(table(["KIND", "NAME", "DATATYPE", "SHAPE"], rows) if rows else "(no inputs or outputs)")
    return "\n".join(lines)


def server_view(doc: dict[str, Any]) -> str:
    return "\n".join([
        f"name:       {cell(doc.get('name'))}",
        f"version:    {cell(doc.get('version'))}",
        "extensions: %s" % (", ".join(doc.get("extensions") or []) or "-"),
    ])
