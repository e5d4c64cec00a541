"""Input and output `reshape` (triton.md §3.3): the model sees its inputs in the configured shape
behind the batch dimension, and clients get outputs in the shape of `dims`."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient


def test_inputs_arrive_reshaped_and_outputs_leave_in_dims_shape(server_factory):
    server = server_factory(["reshape_probe"])
    client = server.http_client()
    try:
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        y = np.array([[7], [8], [9]], dtype=np.int32)
        inputs = [httpclient.InferInput("INPUT0", [3, 4], "FP32"), httpclient.InferInput("INPUT1", [3, 1], "INT32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(y)
        result = client.infer("reshape_probe", inputs)
        np.testing.assert_array_equal(result.as_numpy("SHAPE0"), [[3, 2, 2]] * 3)
        np.testing.assert_array_equal(result.as_numpy("SHAPE1"), [[1]] * 3)  # INPUT1 is one scalar per item
        out = result.as_numpy("OUTPUT0")
        assert out.shape == (3, 4)
        np.testing.assert_array_equal(out, x)
    finally:
        client.close()
