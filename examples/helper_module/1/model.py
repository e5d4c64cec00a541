"""helper_module: model.py importing code that sits beside it.

Like Triton's Python backend, the server puts the version directory (helper_module/1) and the
model directory (helper_module) on sys.path before importing model.py, so:
- `preprocess` comes from helper_module/1/preprocess.py;
- `postprocess` comes from helper_module/postprocess.py.

OUTPUT0 = (INPUT0 - mean) / std (std 0 -> 1); SUMMARY = a short text describing INPUT0.
"""

import numpy as np
import postprocess
import preprocess
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            normalized = preprocess.standardize(data)
            summary = np.array([postprocess.describe(data).encode("utf-8")], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", normalized),
                        pb_utils.Tensor("SUMMARY", summary),
                    ]
                )
            )
        return responses
