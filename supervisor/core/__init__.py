"""The transport-neutral data plane: frontends call it; it knows nothing of HTTP, gRPC or ZeroMQ."""
