"""Tests that start real processes: workers, a frontend's server process, a fresh interpreter, a peer process.

tests/unit/ holds the in-process tests and tests/e2e/ the whole server driven by tritonclient; here the
subfolders mirror the code they test (worker/, instances/, grpc_api/, fuzz/, pytriton/), and the files at
the top test the supervision of real workers (harness.py).
"""
