"""The one flag the hot path reads: whether any request may be traced now. Off (the default), a batch
costs one attribute read for tracing; the Tracer sets it when its settings can trace, or while traces are
in flight. One Tracer per process (the server's)."""

armed = False
