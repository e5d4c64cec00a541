"""Regenerates the seed corpus of fuzz/targets/load_override.py: load requests as tritonclient.http sends them.

    .venv/bin/python fuzz/seeds/override_seeds.py

tritonclient.http's own `load_model` writes each body (its transport is replaced by a function keeping the
body): a plain load, a config override, config + files (a model.py, a config.pbtxt, several versions), and
the requests of issue 38 #6 and of traversal attempts. Mode byte 0, then the body. Files are named by the
sha1 of their content (first 16 hex digits).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fuzz"))
import harness  # noqa: E402  (fuzz/harness.py: save_input)

MODEL_PY = b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
CONFIG = json.dumps({"name": "m", "backend": "python", "max_batch_size": 0,
                     "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                     "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
REQUESTS: list[tuple[str | None, dict[str, bytes] | None]] = [
    (None, None),
    (CONFIG, None),
    (json.dumps({"backend": "python", "instance_group": [{"kind": "KIND_CPU", "count": 2}]}), None),
    (CONFIG, {"file:1/model.py": MODEL_PY}),
    (CONFIG, {"file:1/model.py": MODEL_PY, "file:2/model.py": MODEL_PY, "file:config.pbtxt": b'backend: "python"'}),
    (CONFIG, {"file:1/model.py": MODEL_PY, "file:1/labels.txt": b"a\nb\n"}),
    # issue 38 #6: a name too long for the filesystem; a file and a directory of one name
    (CONFIG, {"file:1/" + "a" * 300: MODEL_PY, "file:1/model.py": MODEL_PY}),
    (CONFIG, {"file:1": MODEL_PY, "file:1/model.py": MODEL_PY}),
    # paths that leave the override directory
    (CONFIG, {"file:../1/model.py": MODEL_PY}),
    (CONFIG, {"file:/tmp/x": MODEL_PY, "file:1/model.py": MODEL_PY}),
    (CONFIG, {"file:1/../../x": MODEL_PY}),
    (None, {"file:1/model.py": MODEL_PY}),
]


def bodies() -> list[bytes]:
    import tritonclient.http._client as http_client

    class _Answer:
        status_code = 200

        def read(self) -> bytes:
            return b""

    client = http_client.InferenceServerClient("127.0.0.1:1")
    sent: list[bytes] = []
    client._post = lambda request_uri, request_body, headers, query_params: (  # type: ignore[method-assign]
        sent.append(request_body.encode() if isinstance(request_body, str) else request_body), _Answer())[1]
    for config, files in REQUESTS:
        client.load_model("m", config=config, files=files)
    return sent


def main() -> None:
    out = ROOT / "fuzz" / "corpus" / "load_override"
    for body in bodies():
        harness.save_input(out, b"\x00" + body)
    print(f"kept {len(REQUESTS)} load requests")


if __name__ == "__main__":
    main()
