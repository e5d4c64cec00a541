"""Everything behind /metrics: Triton's nv_* families, the per-model statistics they are read from, custom
metrics of Python models, GPU metrics, latency summaries and histograms, and the one renderer of the endpoint."""
