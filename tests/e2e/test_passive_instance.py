"""instance_group `passive: true` (Triton's L0_passive_instance): passive instances are loaded but the
scheduler never gives them a request."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient


def test_passive_instances_get_no_requests(server_factory):
    server = server_factory(["passive_probe"])

    def ask(_: int) -> str:
        client = server.http_client()
        try:
            inp = httpclient.InferInput("INPUT0", [1], "INT32")
            inp.set_data_from_numpy(np.array([1], dtype=np.int32))
            return client.infer("passive_probe", [inp]).as_numpy("INSTANCE")[0].decode()
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        names = set(pool.map(ask, range(32)))
    assert names == {"active_0"}
