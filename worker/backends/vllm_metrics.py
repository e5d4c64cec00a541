"""vLLM's engine statistics as custom metrics under the names Triton's vllm_backend gives them (its README,
"Triton Metrics"), when the model's `REPORT_CUSTOM_METRICS` parameter is "true" (and the engine arguments do
not disable log stats): counters vllm:prompt_tokens_total and vllm:generation_tokens_total, histograms of
time to first token, time per output token, end-to-end latency, prompt and generation tokens per request
and the `n` parameter, each labelled with the model's name and version.

The values go into the worker's custom-metric registry without waiting for the supervisor (the heartbeat's
report carries them): vLLM records its stats on the engine's event loop, which must not block.
"""

from __future__ import annotations

from typing import Any

from .. import metric_registry as custom_metrics
from ..wire import metric_rules as rules

_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
_N_BUCKETS = [1, 2, 5, 10, 20]


def _buckets_1_2_5(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > limit:
                return out or [1.0]
            out.append(float(value))
        exponent += 1


class Metrics:
    """The families and the one labelled metric of each."""

    def __init__(self, labels: dict[str, str], max_model_len: int) -> None:
        registry = custom_metrics.REGISTRY
        self._registry = registry

        def family(name: str, description: str, kind: int, buckets: Any = None) -> Any:
            return registry.add_metric(registry.add_family(name, description, kind), labels, buckets)

        counter, histogram = rules.COUNTER, rules.HISTOGRAM
        self.prompt_tokens = family("vllm:prompt_tokens_total", "Number of prefill tokens processed.", counter)
        self.generation_tokens = family("vllm:generation_tokens_total", "Number of generation tokens processed.",
                                        counter)
        self.ttft = family("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           histogram, _TTFT_BUCKETS)
        self.tpot = family("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                           histogram, _TPOT_BUCKETS)
        self.e2e = family("vllm:e2e_request_latency_seconds",
                          "Histogram of end to end request latency in seconds.", histogram, _E2E_BUCKETS)
        lengths = _buckets_1_2_5(max_model_len)
        self.prompt_tokens_request = family("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                            histogram, lengths)
        self.generation_tokens_request = family("vllm:request_generation_tokens",
                                                "Number of generation tokens processed.", histogram, lengths)
        self.n_request = family("vllm:request_params_n", "Histogram of the n request parameter.", histogram,
                                _N_BUCKETS)

    def record(self, iteration: Any) -> None:
        registry = self._registry
        if iteration.num_prompt_tokens:
            registry.increment(self.prompt_tokens, iteration.num_prompt_tokens)
        if iteration.num_generation_tokens:
            registry.increment(self.generation_tokens, iteration.num_generation_tokens)
        observed = [
            (self.ttft, getattr(iteration, "time_to_first_tokens_iter", ())),
            (self.tpot, getattr(iteration, "inter_token_latencies_iter", None)
             or getattr(iteration, "time_per_output_tokens_iter", ())),
            (self.e2e, [r.e2e_latency for r in iteration.finished_requests]),
            (self.prompt_tokens_request, [r.num_prompt_tokens for r in iteration.finished_requests]),
            (self.generation_tokens_request, [r.num_generation_tokens for r in iteration.finished_requests]),
            (self.n_request, getattr(iteration, "n_params_iter", ())),
        ]
        for metric, values in observed:
            for value in values or ():
                registry.observe(metric, value)


def stat_logger_factory(labels: dict[str, str]) -> Any:
    """A vLLM stat-logger factory (a callable of (vllm_config, engine_index)) feeding `Metrics`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InferdStatLogger(StatLoggerBase):  # type: ignore[misc,valid-type]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            super().__init__(vllm_config, engine_index)
            self.metrics = Metrics(labels, int(vllm_config.model_config.max_model_len))

        def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
            if iteration_stats is not None:
                self.metrics.record(iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return InferdStatLogger
