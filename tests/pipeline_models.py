"""The three-step pipeline of the pipelines issue, written on the spot for tests and benchmarks:
preprocess (Python, numpy) -> an ONNX embedder (built with the onnx helper API) -> postprocess
(Python), plus the ensemble that chains them. `reference()` computes the same answer by hand.

Shapes (max_batch_size 0): IMAGE UINT8 [pixels] -> FEATURES FP32 [pixels] -> EMBEDDING FP32 [dim]
-> NORMALIZED FP32 [dim], LABEL INT32 [1]. With pixels = 262144 the intermediate FEATURES tensor is 1 MiB.
"""

from __future__ import annotations

from pathlib import Path

import framework_models as fm
import numpy as np

PRE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            features = (image.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) * np.float32(2.0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("FEATURES", features)]))
        return out
'''

POST = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            emb = pb_utils.get_input_tensor_by_name(request, "EMBEDDING").as_numpy()
            norm = emb / np.float32(max(float(np.linalg.norm(emb)), 1e-12))
            label = np.array([int(np.argmax(emb))], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("NORMALIZED", norm.astype(np.float32)),
                                                   pb_utils.Tensor("LABEL", label)]))
        return out
'''


def weights(pixels: int, dim: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((pixels, dim)) / np.sqrt(pixels)).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    return w, b


def reference(image: np.ndarray, pixels: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The pipeline's answer computed directly (the same float32 operations, onnxruntime for step 2)."""
    import onnxruntime as ort

    features = (image.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) * np.float32(2.0)
    w, b = weights(pixels, dim)
    session = ort.InferenceSession(_onnx_bytes(w, b), providers=["CPUExecutionProvider"])
    emb = session.run(None, {"FEATURES": features})[0]
    norm = emb / np.float32(max(float(np.linalg.norm(emb)), 1e-12))
    return norm.astype(np.float32), np.array([int(np.argmax(emb))], dtype=np.int32)


def _onnx_graph(w: np.ndarray, b: np.ndarray) -> object:
    from onnx import TensorProto, helper, numpy_helper

    pixels, dim = w.shape
    return helper.make_graph(
        [helper.make_node("MatMul", ["FEATURES", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["EMBEDDING"])],
        "embedder",
        [helper.make_tensor_value_info("FEATURES", TensorProto.FLOAT, [pixels])],
        [helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, [dim])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )


def _onnx_bytes(w: np.ndarray, b: np.ndarray) -> bytes:
    from onnx import helper

    model = helper.make_model(_onnx_graph(w, b), opset_imports=[helper.make_opsetid("", fm.ONNX_OPSET)])
    model.ir_version = fm.ONNX_IR_VERSION
    return bytes(model.SerializeToString())


def _io(items: list[tuple[str, str, list[int]]], kind: str) -> str:
    types = {"UINT8": "TYPE_UINT8", "FP32": "TYPE_FP32", "INT32": "TYPE_INT32"}
    return "%s [ %s ]\n" % (kind, ", ".join('{ name: "%s" data_type: %s dims: [ %s ] }'
                                            % (n, types[t], ", ".join(map(str, d))) for n, t, d in items))


def write_pipeline(repo: Path, pixels: int = 4096, dim: int = 16, ensemble: str = "pipeline") -> Path:
    """pipeline_pre, pipeline_embed (ONNX), pipeline_post and the ensemble `ensemble` chaining them."""
    repo.mkdir(parents=True, exist_ok=True)
    pre = repo / "pipeline_pre"
    (pre / "1").mkdir(parents=True, exist_ok=True)
    (pre / "1" / "model.py").write_text(PRE)
    (pre / "config.pbtxt").write_text('name: "pipeline_pre"\nbackend: "python"\n'
                                      + _io([("IMAGE", "UINT8", [pixels])], "input")
                                      + _io([("FEATURES", "FP32", [pixels])], "output"))
    post = repo / "pipeline_post"
    (post / "1").mkdir(parents=True, exist_ok=True)
    (post / "1" / "model.py").write_text(POST)
    (post / "config.pbtxt").write_text('name: "pipeline_post"\nbackend: "python"\n'
                                       + _io([("EMBEDDING", "FP32", [dim])], "input")
                                       + _io([("NORMALIZED", "FP32", [dim]), ("LABEL", "INT32", [1])], "output"))
    embed = repo / "pipeline_embed"
    (embed / "1").mkdir(parents=True, exist_ok=True)
    w, b = weights(pixels, dim)
    (embed / "1" / "model.onnx").write_bytes(_onnx_bytes(w, b))
    (embed / "config.pbtxt").write_text('name: "pipeline_embed"\nbackend: "onnxruntime"\n'
                                        + _io([("FEATURES", "FP32", [pixels])], "input")
                                        + _io([("EMBEDDING", "FP32", [dim])], "output"))
    ens = repo / ensemble
    (ens / "1").mkdir(parents=True, exist_ok=True)
    (ens / "config.pbtxt").write_text(
        f'name: "{ensemble}"\nplatform: "ensemble"\n'
        + _io([("IMAGE", "UINT8", [pixels])], "input")
        + _io([("NORMALIZED", "FP32", [dim]), ("LABEL", "INT32", [1])], "output")
        + '''ensemble_scheduling { step [
  { model_name: "pipeline_pre" model_version: -1
    input_map { key: "IMAGE" value: "IMAGE" } output_map { key: "FEATURES" value: "features" } },
  { model_name: "pipeline_embed" model_version: -1
    input_map { key: "FEATURES" value: "features" } output_map { key: "EMBEDDING" value: "embedding" } },
  { model_name: "pipeline_post" model_version: -1
    input_map { key: "EMBEDDING" value: "embedding" }
    output_map { key: "NORMALIZED" value: "NORMALIZED" } output_map { key: "LABEL" value: "LABEL" } }
] }
''')
    return repo
