"""add_sub with two instances; INSTANCE tells which instance served the request."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"].encode("utf-8")

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(np.float32)),
                        pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(np.float32)),
                        pb_utils.Tensor("INSTANCE", np.array([self.instance], dtype=np.object_)),
                    ]
                )
            )
        return responses
