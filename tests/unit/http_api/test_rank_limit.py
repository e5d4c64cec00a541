"""HTTP bounds a tensor's rank by inference/limits.MAX_DIMS (the gRPC frontend applies the same limit):
one dimension over it is a 400 naming the tensor and the limit, whether the data comes as JSON or as
binary tensor data; a tensor at the limit is served."""

from __future__ import annotations

import http.client
import json

import numpy as np
from inferd.supervisor.inference.limits import MAX_DIMS

from .conftest import Served


def _post(served: Served, shape: list[int], binary: bool) -> tuple[int, bytes]:
    item: dict = {"name": "INPUT0", "datatype": "FP32", "shape": shape}
    data = np.ones(1, np.float32).tobytes()
    if binary:
        item["parameters"] = {"binary_data_size": len(data)}
    else:
        item["data"] = [1.0]
    head = json.dumps({"inputs": [item]}).encode()
    body = head + data if binary else head
    headers = {"Inference-Header-Content-Length": str(len(head))} if binary else {}
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        conn.request("POST", "/v2/models/identity_FP32/infer", body, headers)
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def test_a_tensor_at_the_rank_limit_is_served(served: Served) -> None:
    for binary in (False, True):
        status, body = _post(served, [1] * MAX_DIMS, binary)
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["shape"] == [1] * MAX_DIMS


def test_one_dimension_over_the_limit_is_refused_naming_tensor_and_limit(served: Served) -> None:
    for binary in (False, True):
        status, body = _post(served, [1] * (MAX_DIMS + 1), binary)
        assert status == 400, body
        error = json.loads(body)["error"]
        assert "'INPUT0'" in error and f"{MAX_DIMS + 1} dimensions" in error and f"at most {MAX_DIMS}" in error
