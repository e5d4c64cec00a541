"""The gRPC frontend (KServe v2 / Triton GRPCInferenceService + grpc.health.v1) over the core data plane."""
