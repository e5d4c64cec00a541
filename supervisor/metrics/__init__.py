"""Everything behind /metrics (docs/metrics.md lists the families), one module per job:

- `model_statistics.py`: per (model, version) counters, recorded on the hot path by the schedulers, the ensemble,
  the response cache and the data plane; `StatsRegistry` holds them. The statistics extension
  (`/v2/models/stats`, `ModelStatistics`) is their JSON.
- `latency_summary.py`, `latency_histogram.py`: the latency summaries and the first-response histogram
  (`--metrics-config`), kept per version beside those counters.
- `model_families.py`: Triton's per-model `nv_*` families, read from the statistics at scrape time.
- `server_families.py`: the server-wide ones: instances, shared memory, pinned pool, CPU and RAM, the response
  cache's gauges.
- `gpu.py`: the NVML poller and its `nv_gpu_*` families.
- `custom.py`: the custom metrics Python models make (`pb_utils.MetricFamily`), merged from the workers' reports.
- `text_format.py`: the Prometheus text format (escaping, values, a family's lines, the one CONTENT_TYPE).
- `endpoint.py`: the one renderer of the /metrics body (`MetricsEndpoint.render`), behind
  `DataPlane.metrics_text()`, which the metrics port and the OpenAI port's GET /metrics call.

Why the statistics live here and not as a package of their own: the statistics extension and /metrics are two
readings of one set of counters, and a request is recorded once, into `ModelStats`. That object also holds
the latency rings and the histogram that only /metrics reads. A separate statistics package would import this
one for those, and this one would import it for the counters: a cycle. So the one record of what happened to
each model version lives here, and the statistics JSON is one reader of it (`ModelStats.to_json`).

The package sits low in the import contract: it imports no frontend, core, scheduler or instance module
(what it reads from them at scrape time, it types by what it reads: endpoint.py), so every layer above may
record into it or render it.
"""
