"""string_reverse: a BYTES model. Each element of INPUT0 comes back reversed in OUTPUT0.

UTF-8 text is reversed by characters; anything that is not valid UTF-8 is reversed byte by byte.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def reverse(item):
    if isinstance(item, str):
        item = item.encode("utf-8")
    try:
        return item.decode("utf-8")[::-1].encode("utf-8")
    except UnicodeDecodeError:
        return item[::-1]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            flat = [reverse(item) for item in data.reshape(-1)]
            out = np.array(flat, dtype=np.object_).reshape(data.shape)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)]))
        return responses
