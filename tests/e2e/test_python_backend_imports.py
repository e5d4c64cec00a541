"""model.py may import its neighbours relatively (`from .scale import FACTOR`), as Triton imports it as
`<version>.model`; plain imports of the version and model directories keep working (examples/helper_module)."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient


def test_relative_and_plain_imports(server_factory):
    server = server_factory(["relative_import", "helper_module"])
    client = server.http_client()
    try:
        data = np.array([1.0, 2.0], dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("relative_import", [inp]).as_numpy("OUTPUT0"), data * 3)
        assert server.model_ready("helper_module")
    finally:
        client.close()
