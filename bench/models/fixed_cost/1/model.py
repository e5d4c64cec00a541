"""Echoes INPUT0 after a fixed cost per execute() call (parameter cost_ms), whatever the batch size:
the case where batching pays most (a GPU kernel launch, a remote call)."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.cost_s = float(params.get("cost_ms", {}).get("string_value", "5")) / 1000.0

    def execute(self, requests):
        time.sleep(self.cost_s)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
