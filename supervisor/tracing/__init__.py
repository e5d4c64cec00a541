"""Request tracing as Triton 2.51 does it (--trace-config, the trace extension).

options.py reads the command line; tracer.py decides which requests are traced and hands finished traces
to a sink: trace_file.py (mode `triton`, Triton's JSON trace files) or otel.py (mode `opentelemetry`,
spans over OTLP/HTTP). record.py is one request's trace; live.py the one flag the instances read.
"""
