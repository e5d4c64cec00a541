"""Models for the framework-backend tests and benchmarks, built on the spot (never downloaded):
ONNX graphs with the `onnx` helper API, TorchScript modules with torch.jit. Each writer lays out a
Triton model directory `<repo>/<name>/[config.pbtxt] 1/<model file>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ONNX_OPSET = 17
ONNX_IR_VERSION = 8

_ONNX_TYPES = {"FP32": 1, "INT32": 6, "INT64": 7, "FP64": 11}  # onnx.TensorProto values
_CONFIG_TYPES = {"FP32": "TYPE_FP32", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "FP64": "TYPE_FP64"}


def config_pbtxt(name: str, backend: str, inputs: list[tuple[str, str, list[int]]],
                 outputs: list[tuple[str, str, list[int]]], max_batch_size: int = 0, extra: str = "") -> str:
    def io(kind: str, items: list[tuple[str, str, list[int]]]) -> str:
        body = ",\n".join('  { name: "%s" data_type: %s dims: [ %s ] }'
                          % (n, _CONFIG_TYPES[t], ", ".join(str(d) for d in dims)) for n, t, dims in items)
        return "%s [\n%s\n]\n" % (kind, body)

    return ('name: "%s"\nbackend: "%s"\nmax_batch_size: %d\n' % (name, backend, max_batch_size)
            + io("input", inputs) + io("output", outputs) + extra)


def _model_dir(repo: Path, name: str, config: str | None) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return version


def _save_onnx(graph: Any, path: Path, external: bool = False) -> Any:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(model)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return model


def onnx_add_sub(repo: Path, name: str, datatype: str = "FP32", dims: tuple[int, ...] = (16,),
                 batch: bool = False, config: bool = True, max_batch_size: int = 8,
                 extra_config: str = "") -> Path:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1; `batch`: a dynamic first dim."""
    from onnx import helper

    t = _ONNX_TYPES[datatype]
    shape: list[Any] = (["batch"] if batch else []) + list(dims)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        name,
        [helper.make_tensor_value_info("INPUT0", t, shape), helper.make_tensor_value_info("INPUT1", t, shape)],
        [helper.make_tensor_value_info("OUTPUT0", t, shape), helper.make_tensor_value_info("OUTPUT1", t, shape)],
    )
    io_dims = list(dims)
    text = None
    if config:
        text = config_pbtxt(name, "onnxruntime", [("INPUT0", datatype, io_dims), ("INPUT1", datatype, io_dims)],
                            [("OUTPUT0", datatype, io_dims), ("OUTPUT1", datatype, io_dims)],
                            max_batch_size if batch else 0, extra_config)
    version = _model_dir(repo, name, text)
    _save_onnx(graph, version / "model.onnx")
    return version / "model.onnx"


def mlp_weights(width: int = 1024, hidden: int = 256, out: int = 16, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((width, hidden)).astype(np.float32) * 0.03,
            rng.standard_normal(hidden).astype(np.float32) * 0.01,
            rng.standard_normal((hidden, out)).astype(np.float32) * 0.06,
            rng.standard_normal(out).astype(np.float32) * 0.01]


def onnx_mlp(repo: Path, name: str, width: int = 1024, external: bool = False, config: bool = True) -> Path:
    """Y = relu(X @ W1 + b1) @ W2 + b2 with X [batch, width]; `external`: a model.onnx/ directory
    holding model.onnx plus its weights in weights.bin."""
    from onnx import helper, numpy_helper

    w1, b1, w2, b2 = mlp_weights(width)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (b1, "B1"), (w2, "W2"), (b2, "B2"))]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W1", "B1"], ["H"]), helper.make_node("Relu", ["H"], ["R"]),
         helper.make_node("Gemm", ["R", "W2", "B2"], ["Y"])],
        name,
        [helper.make_tensor_value_info("X", 1, ["batch", width])],
        [helper.make_tensor_value_info("Y", 1, ["batch", w2.shape[1]])],
        initializer=inits,
    )
    text = None
    if config:
        text = config_pbtxt(name, "onnxruntime", [("X", "FP32", [width])], [("Y", "FP32", [w2.shape[1]])], 8,
                            "dynamic_batching { }\n")
    version = _model_dir(repo, name, text)
    if external:
        target = version / "model.onnx"
        target.mkdir()
        _save_onnx(graph, target / "model.onnx", external=True)
        return target / "model.onnx"
    _save_onnx(graph, version / "model.onnx")
    return version / "model.onnx"


# ---- TorchScript ------------------------------------------------------------------------------


def torch_modules() -> dict[str, Any]:
    """Module classes, defined only when torch is importable."""
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: N803
            return INPUT0 + INPUT1, INPUT0 - INPUT1

    class Named(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a * 2 + b, a - b

    class MLP(torch.nn.Module):
        def __init__(self, width: int = 1024) -> None:
            super().__init__()
            w1, b1, w2, b2 = mlp_weights(width)
            self.l1 = torch.nn.Linear(width, w1.shape[1])
            self.l2 = torch.nn.Linear(w1.shape[1], w2.shape[1])
            with torch.no_grad():
                self.l1.weight.copy_(torch.from_numpy(w1.T.copy()))
                self.l1.bias.copy_(torch.from_numpy(b1))
                self.l2.weight.copy_(torch.from_numpy(w2.T.copy()))
                self.l2.bias.copy_(torch.from_numpy(b2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.l2(torch.relu(self.l1(x)))

    return {"AddSub": AddSub, "Named": Named, "MLP": MLP}


def torch_save(repo: Path, name: str, module: Any, config: str, traced_example: tuple | None = None) -> Path:
    """Script (or trace with `traced_example`) `module` into `<repo>/<name>/1/model.pt`."""
    import torch

    module = module.eval()
    jit = torch.jit.trace(module, traced_example) if traced_example is not None else torch.jit.script(module)
    version = _model_dir(repo, name, config)
    jit.save(str(version / "model.pt"))
    return version / "model.pt"


# ---- ragged batching (docs/ragged-batching.md) --------------------------------------------------

RAGGED_OUTPUTS = ("RAGGED_OUTPUT", "COUNT_OUT", "ACC_OUT", "ACC0_OUT", "MAX_OUT", "ITEM_OUT", "FLAT_OUT")


def ragged_config(name: str, backend: str, max_batch_size: int = 5) -> str:
    """RAGGED_INPUT [-1, -1] ragged; one batch_input of each kind but BATCH_ITEM_SHAPE's twin, each echoed to
    an output; RAGGED_OUTPUT = 2 x RAGGED_INPUT scattered back with RAGGED_INPUT's shape. The ITEM batch input
    ([total batch, 2]) gives the model its row count: every other batch input comes back once per row."""
    outputs = ",\n".join('  { name: "%s" data_type: TYPE_FP32 dims: [ %s ] }' % (n, d) for n, d in (
        ("RAGGED_OUTPUT", "-1, -1"), ("COUNT_OUT", "-1"), ("ACC_OUT", "-1"), ("ACC0_OUT", "-1"), ("MAX_OUT", "1"),
        ("ITEM_OUT", "2"), ("FLAT_OUT", "-1")))
    batch_inputs = ",\n".join(
        '  { kind: %s target_name: "%s" data_type: %s source_input: "RAGGED_INPUT" }' % spec for spec in (
            ("BATCH_ELEMENT_COUNT", "COUNT", "TYPE_FP32"), ("BATCH_ACCUMULATED_ELEMENT_COUNT", "ACC", "TYPE_INT32"),
            ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "ACC0", "TYPE_FP32"),
            ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "MAXS", "TYPE_FP32"), ("BATCH_ITEM_SHAPE", "ITEM", "TYPE_FP32"),
            ("BATCH_ITEM_SHAPE_FLATTEN", "FLAT", "TYPE_INT32")))
    return ('name: "%s"\nbackend: "%s"\nmax_batch_size: %d\n' % (name, backend, max_batch_size)
            + 'input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]\n'
            + "output [\n%s\n]\nbatch_input [\n%s\n]\n" % (outputs, batch_inputs)
            + 'batch_output [ { target_name: "RAGGED_OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
              'source_input: "RAGGED_INPUT" } ]\n'
            + "dynamic_batching { max_queue_delay_microseconds: 30000000 }\n")


def onnx_ragged(repo: Path, name: str, max_batch_size: int = 5) -> Path:
    """The ragged probe of `ragged_config` as an ONNX graph."""
    from onnx import TensorProto, helper, numpy_helper

    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             (("two", 2.0), ("zero", 0.0), ("one", 1.0), ("half_col", [[0.5], [0.5]]))]
    inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), "row"))
    nodes = [helper.make_node("Mul", ["RAGGED_INPUT", "two"], ["RAGGED_OUTPUT"]),
             helper.make_node("Mul", ["ITEM", "zero"], ["item0"]), helper.make_node("Add", ["item0", "one"], ["ones"]),
             helper.make_node("MatMul", ["ones", "half_col"], ["expander"]),  # [rows, 1] of ones
             helper.make_node("Identity", ["ITEM"], ["ITEM_OUT"]),
             helper.make_node("Shape", ["MAXS"], ["maxs_shape"]),
             helper.make_node("Cast", ["maxs_shape"], ["MAXS_f"], to=f32)]
    for source, cast in (("COUNT", False), ("ACC", True), ("ACC0", False), ("MAXS_f", False), ("FLAT", True)):
        value = source
        if cast:
            nodes.append(helper.make_node("Cast", [source], [source + "_f"], to=f32))
            value = source + "_f"
        out = {"MAXS_f": "MAX_OUT"}.get(source, source + "_OUT")
        nodes += [helper.make_node("Reshape", [value, "row"], [source + "_row"]),
                  helper.make_node("MatMul", ["expander", source + "_row"], [out])]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("RAGGED_INPUT", f32, ["e"]), helper.make_tensor_value_info("COUNT", f32, ["n"]),
         helper.make_tensor_value_info("ACC", i32, ["n"]), helper.make_tensor_value_info("ACC0", f32, ["n1"]),
         helper.make_tensor_value_info("MAXS", f32, ["m"]), helper.make_tensor_value_info("ITEM", f32, ["t", 2]),
         helper.make_tensor_value_info("FLAT", i32, ["t2"])],
        [helper.make_tensor_value_info(n, f32, ["e"] if n == "RAGGED_OUTPUT" else ["rows", n.lower()])
         for n in RAGGED_OUTPUTS],
        initializer=inits,
    )
    version = _model_dir(repo, name, ragged_config(name, "onnxruntime", max_batch_size))
    _save_onnx(graph, version / "model.onnx")
    return version / "model.onnx"


def torch_ragged(repo: Path, name: str, max_batch_size: int = 5) -> Path:
    """The ragged probe of `ragged_config` as a scripted module (inputs by forward() argument name)."""
    import torch

    class RaggedProbe(torch.nn.Module):
        def forward(self, RAGGED_INPUT: torch.Tensor, COUNT: torch.Tensor, ACC: torch.Tensor,  # noqa: N803
                    ACC0: torch.Tensor, MAXS: torch.Tensor, ITEM: torch.Tensor,  # noqa: N803
                    FLAT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,  # noqa: N803
                                                 torch.Tensor, torch.Tensor, torch.Tensor]:
            rows = torch.ones(ITEM.shape[0], 1)
            maxs = torch.tensor([float(MAXS.shape[0])])
            return (RAGGED_INPUT * 2, rows * COUNT.view(1, -1), rows * ACC.float().view(1, -1),
                    rows * ACC0.view(1, -1), rows * maxs.view(1, -1), ITEM, rows * FLAT.float().view(1, -1))

    return torch_save(repo, name, RaggedProbe(), ragged_config(name, "pytorch", max_batch_size))


def ragged_reference(shapes: list[tuple[int, ...]]) -> list[dict[str, np.ndarray]]:
    """What each request of one batch gets from the ragged probe, from Triton's definitions of the batch
    inputs (model_config.proto) computed here with numpy; RAGGED_OUTPUT is left to the caller (2 x input)."""
    counts = np.array([int(np.prod(s)) for s in shapes], np.float32)
    rows = [list(s[1:]) for s in shapes for _ in range(s[0])]
    item = np.array(rows, np.float32).reshape(len(rows), 2)
    per_batch = {"COUNT_OUT": counts, "ACC_OUT": np.cumsum(counts),
                 "ACC0_OUT": np.concatenate([[0], np.cumsum(counts)]),
                 "MAX_OUT": np.array([counts.max()], np.float32), "FLAT_OUT": item.reshape(-1)}
    out, start = [], 0
    for s in shapes:
        b = s[0]
        entry = {k: np.tile(v.astype(np.float32), (b, 1)) for k, v in per_batch.items()}
        entry["ITEM_OUT"] = item[start:start + b]
        out.append(entry)
        start += b
    return out
