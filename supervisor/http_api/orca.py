"""Load reports for load balancers: the `endpoint-load-metrics` response header (ORCA), as Triton sends it
since 2.57 (its src/orca_http.cc).

A request to an HTTP generate endpoint (/v2/models/<m>[/versions/<v>]/generate or /generate_stream) with the
header `endpoint-load-metrics-format: text` or `json` gets, with its answer, the KV-cache figures of the
`nv_trt_llm_kv_cache_block_metrics` gauges that TensorRT-LLM backends export (any model may, through
pb_utils.MetricFamily), one series per `kv_cache_block_type` label: "max" (blocks), "used" (blocks) and
"tokens_per" (tokens per block):

    kv_cache_utilization = used / max (0 when max is 0)     max_token_capacity = max * tokens_per
    text: TEXT named_metrics.kv_cache_utilization=0.500000, named_metrics.max_token_capacity=4096
    json: JSON {"named_metrics":{"kv_cache_utilization":0.5,"max_token_capacity":4096}}

There is no header when the format is neither of the two, or when one of the three figures is missing
(Triton logs an error on each such request; inferd logs each distinct case once). Where several series
carry one figure, inferd takes the requested model's (label `model`), else the last in label order; Triton
takes whichever comes last in its /metrics text. Triton sends the header on the generate endpoints only
(neither /infer nor gRPC), and so does inferd.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("inferd.orca")

REQUEST_HEADER = "endpoint-load-metrics-format"  # the request's header naming the format
RESPONSE_HEADER = "endpoint-load-metrics"
FORMATS = ("text", "json")
KV_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
KV_TYPE_LABEL = "kv_cache_block_type"
_TYPES = ("tokens_per", "used", "max")

_logged: set[str] = set()


def _log_once(text: str) -> None:
    if text not in _logged and len(_logged) < 100:
        _logged.add(text)
        log.warning("%s", text)


def kv_figures(samples: Iterable[tuple[Mapping[str, str], float]], model: str = "") -> dict[str, float] | None:
    """{"tokens_per", "used", "max"} from the family's (labels, value) samples, or None when one is missing
    (or negative, or not finite)."""
    found: dict[str, float] = {}
    own: dict[str, float] = {}
    for labels, value in samples:
        kind = labels.get(KV_TYPE_LABEL)
        if kind not in _TYPES or not math.isfinite(value) or value < 0:
            continue
        found[kind] = value
        if model and labels.get("model") == model:
            own[kind] = value
    figures = {**found, **own}
    return figures if len(figures) == len(_TYPES) else None


def _json_double(value: float) -> str:
    """A double as Triton's JSON writer (rapidjson) writes it: shortest round trip, 0.0, 1e-5."""
    text = repr(float(value))
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def header_value(fmt: str, utilization: float, capacity: float) -> str | None:
    """The header in `fmt` ("text" or "json"); None for any other format."""
    tokens = int(capacity)
    if fmt == "json":
        return ('JSON {"named_metrics":{"kv_cache_utilization":%s,"max_token_capacity":%d}}'
                % (_json_double(utilization), tokens))
    if fmt == "text":  # (std::to_string of a double: six decimals)
        return "TEXT named_metrics.kv_cache_utilization=%f, named_metrics.max_token_capacity=%d" % (utilization, tokens)
    return None


def load_report(custom_metrics: Any, fmt: str, model: str = "") -> str | None:
    """The header for a request to `model` asking for `fmt`, from the models' custom metrics
    (metrics.custom.CustomMetrics); None when there is none to send."""
    if fmt not in FORMATS:
        _log_once(f"{REQUEST_HEADER}: '{fmt[:40]}' is not a load report format (text, json): no {RESPONSE_HEADER} "
                  "header is sent")
        return None
    figures = kv_figures(custom_metrics.samples(KV_FAMILY), model)
    if figures is None:
        _log_once(f"{REQUEST_HEADER} asked for a load report, but no model exports the {KV_FAMILY} gauges "
                  f"({KV_TYPE_LABEL}=max, used and tokens_per): no {RESPONSE_HEADER} header is sent")
        return None
    blocks = figures["max"]
    utilization = figures["used"] / blocks if blocks > 0 else 0.0
    capacity = blocks * figures["tokens_per"]
    if not (math.isfinite(utilization) and math.isfinite(capacity)):  # finite figures, infinite product
        _log_once(f"the {KV_FAMILY} gauges give no finite load report (max, used, tokens_per): no "
                  f"{RESPONSE_HEADER} header is sent")
        return None
    return header_value(fmt, utilization, capacity)
