"""bench/cold_send.py's model: decoupled; execute keeps its requests (the bench sends on their senders)."""

import triton_python_backend_utils as pb_utils  # noqa: F401  (the worker's module; imported as models do)


class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        self.kept.extend(requests)
        return None
