"""A small HTTP/2 server for gRPC: frames, HPACK, connections, gRPC calls."""
