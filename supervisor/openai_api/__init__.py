"""The OpenAI-compatible API (--openai-port): /v1/models, /v1/completions, /v1/chat/completions,
/v1/embeddings, model load/unload, /metrics and /health/ready, served by the supervisor beside the KServe
frontends over the same data plane, on http_api's HTTP/1.1 server (docs/openai.md).

`frontend.start(dataplane, config)` starts it (app.py); the other modules each do one job (see
docs/architecture.md, "OpenAI API").
"""
