"""normalize.py: every rule of triton.md §3.10 / §3.4 / §4.2, and validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.supervisor.repository import config as C
from inferd.supervisor.repository import layout
from inferd.worker.wire.errors import ErrorCode, InferdError

from . import samples
from .conftest import write_model

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
CPU = mc.ModelInstanceGroup.KIND_CPU
GPU = mc.ModelInstanceGroup.KIND_GPU


def norm(repo: Path, name: str, config: str | None, files: tuple[str, ...] = ("model.py",),
         **kw: object) -> mc.ModelConfig:
    write_model(repo, name, config, files=files)
    src = layout.read_model(str(repo), name)
    return C.normalize(C.load_config(src), src, **kw)  # type: ignore[arg-type]


def err(repo: Path, name: str, config: str | None, files: tuple[str, ...] = ("model.py",), **kw: object) -> str:
    with pytest.raises(InferdError) as e:
        norm(repo, name, config, files, **kw)
    assert e.value.code == ErrorCode.INVALID_ARG
    return e.value.message


def test_name_from_directory_and_mismatch(repo: Path) -> None:
    assert norm(repo, "m", IO).name == "m"
    msg = err(repo, "badname", 'name: "othername"\n' + IO)
    assert msg == ("unexpected directory name 'badname' for model 'othername', "
                   "directory name must equal model name")


@pytest.mark.parametrize(
    "filename, backend, platform",
    [
        ("model.py", "python", ""),
        ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
        ("model.pt", "pytorch", "pytorch_libtorch"),
        ("model.plan", "tensorrt", "tensorrt_plan"),
        ("model.savedmodel", "tensorflow", "tensorflow_savedmodel"),
        ("model.xml", "openvino", ""),
    ],
)
def test_backend_from_default_file(repo: Path, filename: str, backend: str, platform: str) -> None:
    cfg = norm(repo, "m", IO, files=(filename,))
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == (backend, platform, filename)


def test_backend_from_platform_and_platform_from_backend(repo: Path) -> None:
    cfg = norm(repo, "a", 'platform: "onnxruntime_onnx"\n' + IO, files=())
    assert (cfg.backend, cfg.default_model_filename) == ("onnxruntime", "model.onnx")
    cfg = norm(repo, "b", 'backend: "onnxruntime"\n' + IO, files=())
    assert (cfg.platform, cfg.default_model_filename) == ("onnxruntime_onnx", "model.onnx")
    cfg = norm(repo, "c", 'backend: "python"\n' + IO, files=())
    assert (cfg.platform, cfg.default_model_filename) == ("", "model.py")
    cfg = norm(repo, "d", 'backend: "python"\ndefault_model_filename: "entry.py"\n' + IO, files=())
    assert cfg.default_model_filename == "entry.py"
    cfg = norm(repo, "e", 'backend: "mycustom"\n' + IO, files=())
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == ("mycustom", "", "")


def test_backend_from_named_default_file_and_hint(repo: Path) -> None:
    cfg = norm(repo, "a", 'default_model_filename: "net.onnx"\n' + IO, files=("net.onnx",))
    assert cfg.backend == "onnxruntime" and cfg.default_model_filename == "net.onnx"
    cfg = norm(repo, "b", IO, files=("weights.bin",), backend_hint="python")
    assert cfg.backend == "python"
    msg = err(repo, "c", IO, files=("weights.bin",))
    assert "unable to determine the backend of model 'c'" in msg and "model.py" in msg


def test_version_policy_default(repo: Path) -> None:
    cfg = norm(repo, "m", IO)
    assert cfg.version_policy.WhichOneof("policy_choice") == "latest"
    assert cfg.version_policy.latest.num_versions == 1
    cfg = norm(repo, "n", "version_policy { all { } }\n" + IO)
    assert cfg.version_policy.WhichOneof("policy_choice") == "all"


def test_dynamic_batching_preferred_default(repo: Path) -> None:
    assert list(norm(repo, "a", "max_batch_size: 8\ndynamic_batching { }\n" + IO)
                .dynamic_batching.preferred_batch_size) == [8]
    assert list(norm(repo, "b", "max_batch_size: 0\ndynamic_batching { }\n" + IO)
                .dynamic_batching.preferred_batch_size) == []
    assert list(norm(repo, "c", "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [2, 4] }\n" + IO)
                .dynamic_batching.preferred_batch_size) == [2, 4]
    assert not norm(repo, "d", "max_batch_size: 8\n" + IO).HasField("dynamic_batching")


def test_sequence_batching_defaults(repo: Path) -> None:
    cfg = norm(repo, "a", "max_batch_size: 4\nsequence_batching { oldest { } }\n" + IO)
    assert cfg.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(cfg.sequence_batching.oldest.preferred_batch_size) == [4]
    cfg = norm(repo, "b", "max_batch_size: 4\nsequence_batching { max_sequence_idle_microseconds: 7 "
                          "direct { } }\n" + IO)
    assert cfg.sequence_batching.max_sequence_idle_microseconds == 7
    assert not cfg.sequence_batching.HasField("oldest")


def test_pinned_memory_defaults(repo: Path) -> None:
    cfg = norm(repo, "a", IO)
    assert cfg.optimization.input_pinned_memory.enable and cfg.optimization.output_pinned_memory.enable
    cfg = norm(repo, "b", "optimization { input_pinned_memory { enable: false } }\n" + IO)
    assert not cfg.optimization.input_pinned_memory.enable
    assert cfg.optimization.output_pinned_memory.enable


def test_instance_group_implicit(repo: Path) -> None:
    g = norm(repo, "m", IO).instance_group
    assert len(g) == 1 and (g[0].name, g[0].kind, g[0].count, list(g[0].gpus)) == ("m", CPU, 1, [])


def test_instance_group_names_kinds_counts(repo: Path) -> None:
    text = IO + """instance_group [ { name: "grp" count: 3 kind: KIND_CPU }, { kind: KIND_CPU }, { count: 2 } ]"""
    g = norm(repo, "m", text).instance_group
    assert [(x.name, x.kind, x.count) for x in g] == [("grp", CPU, 3), ("m_1", CPU, 1), ("m_2", CPU, 2)]


def test_instance_group_cpu_count_2_for_onnxruntime(repo: Path) -> None:
    g = norm(repo, "m", IO, files=("model.onnx",)).instance_group
    assert (g[0].kind, g[0].count) == (CPU, 2)


def test_instance_group_kind_auto_with_gpu(repo: Path) -> None:
    g = norm(repo, "m", IO, has_gpu=True).instance_group
    assert (g[0].kind, g[0].count, list(g[0].gpus)) == (GPU, 1, [0])
    g = norm(repo, "n", IO, gpu_ids=[0, 1]).instance_group
    assert list(g[0].gpus) == [0, 1]
    # a listed GPU that is not present makes KIND_AUTO fall back to CPU... then CPU + gpus is invalid
    msg = err(repo, "o", IO + "instance_group [ { gpus: [ 3 ] } ]", gpu_ids=[0])
    assert "KIND_CPU but specifies one or more GPUs" in msg


def test_instance_group_kind_gpu(repo: Path) -> None:
    g = norm(repo, "a", IO + "instance_group [ { kind: KIND_GPU count: 2 } ]", gpu_ids=[0, 1]).instance_group
    assert (g[0].count, list(g[0].gpus)) == (2, [0, 1])
    msg = err(repo, "gpu_kind", IO + "instance_group [ { kind: KIND_GPU } ]")
    assert msg == "instance group gpu_kind_0 of model gpu_kind has kind KIND_GPU but no GPUs are available"
    msg = err(repo, "c", IO + "instance_group [ { kind: KIND_GPU gpus: [ 5 ] } ]", gpu_ids=[0])
    assert "invalid or unsupported gpu id 5" in msg


def test_kind_model_kept(repo: Path) -> None:
    g = norm(repo, "m", IO + "instance_group [ { kind: KIND_MODEL } ]").instance_group
    assert (g[0].kind, g[0].count) == (mc.ModelInstanceGroup.KIND_MODEL, 1)


def test_execution_env_path_substitution(repo: Path) -> None:
    cfg = norm(repo, "llm", samples.LLM_DECOUPLED.replace("max_batch_size: 0", ""))
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value == str(repo / "llm") + "/python_env.tar.gz"
    other = 'parameters { key: "OTHER" value { string_value: "$$TRITON_MODEL_DIRECTORY/x" } }\n'
    cfg = norm(repo, "m", IO + other)
    assert cfg.parameters["OTHER"].string_value == "$$TRITON_MODEL_DIRECTORY/x"


def test_ensemble(repo: Path) -> None:
    cfg = norm(repo, "ensemble_model", samples.ENSEMBLE, files=())
    assert cfg.platform == "ensemble" and cfg.backend == "" and cfg.default_model_filename == ""
    assert not cfg.instance_group and not cfg.HasField("optimization")
    assert cfg.HasField("model_transaction_policy") and not cfg.model_transaction_policy.decoupled
    # platform inferred from ensemble_scheduling
    cfg = norm(repo, "e2", samples.ENSEMBLE.replace('platform: "ensemble"', "").replace("ensemble_model", "e2"),
               files=())
    assert cfg.platform == "ensemble"
    msg = err(repo, "e3", samples.ENSEMBLE.replace("ensemble_model", "e3") + "instance_group [ { count: 1 } ]",
              files=())
    assert msg == "instance group should not be specified for ensemble 'e3'"
    msg = err(repo, "e4", 'platform: "ensemble"\n' + IO, files=())
    assert "ensemble scheduling must be set" in msg
    msg = err(repo, "e5", 'platform: "ensemble"\nensemble_scheduling { }\n' + IO, files=())
    assert "one or more 'step's" in msg
    msg = err(repo, "e6", 'backend: "python"\nensemble_scheduling { step [ { model_name: "x" } ] }\n' + IO,
              files=())
    assert msg == "ensemble scheduling cannot be set for model 'e6' whose platform is not ensemble"


def test_normalize_is_idempotent_and_copies(repo: Path) -> None:
    for name, text in samples.ALL.items():
        files = {"densenet_onnx": ("model.onnx",), "resnet50_trt": ("model.plan",), "bert_pt": ("model.pt",),
                 "ensemble_model": ()}.get(name, ("model.py",))
        write_model(repo, name, text, files=files)
        src = layout.read_model(str(repo), name)
        raw = C.load_config(src)
        before = mc.ModelConfig()
        before.CopyFrom(raw)
        once = C.normalize(raw, src, has_gpu=True)
        assert raw == before, "input config mutated"
        assert C.normalize(once, src, has_gpu=True) == once, name


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ("max_batch_size: -1\n" + IO, "'max_batch_size' must be non-negative value for m"),
        ('input [ { name: "IN" data_type: TYPE_FP32 dims: [ ] } ]', "model input 'IN' must specify 'dims' for m"),
        ('input [ { name: "IN" dims: [ 1 ] } ]', "model input 'IN' must specify 'data_type' for m"),
        ('output [ { name: "O" data_type: TYPE_FP32 dims: [ 0 ] } ]', "model output 'O' dimension must be integer"),
        ('input [ { name: "IN" data_type: TYPE_FP32 dims: [ -2 ] } ]', "dimension must be integer >= 1"),
        ('input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]', "model input must specify 'name' for m"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]',
         "model input 'A' is specified more than once for m"),
        ('output [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]',
         "model output 'A' is specified more than once for m"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape { shape: [ 5 ] } } ]',
         "model input 'A' has different size for dims and reshape for m"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [ 8 ] }\n" + IO,
         "dynamic batching preferred size must be <= max batch size for m"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [ 0 ] }\n" + IO,
         "dynamic batching preferred size must be positive for m"),
        ("max_batch_size: 4\ndynamic_batching { preserve_ordering: true priority_levels: 2 "
         "default_priority_level: 1 }\n" + IO,
         "Only one priority level is allowed when 'preserve_ordering' is true for m"),
        ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 }\n" + IO,
         "default priority level must be in range [1, 2] for m"),
        ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 3 value { } } }\n" + IO,
         "priority queue policy must have priority level in range [1, 2] for m"),
        ("max_batch_size: 2\nsequence_batching { oldest { preferred_batch_size: [ 4 ] } }\n" + IO,
         "sequence batching oldest preferred size must be <= max batch size for m"),
        ('sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }\n'
         + IO, "sequence batching control input 'S' must specify exactly one of"),
        ('sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
         "data_type: TYPE_FP32 } ] } ] }\n" + IO, "CONTROL_SEQUENCE_CORRID must specify a 'data_type'"),
    ],
)
def test_validation_errors(repo: Path, extra: str, fragment: str) -> None:
    msg = err(repo, "m", 'backend: "python"\n' + extra)
    assert fragment in msg


def test_reshape_scalar_and_variable_ok(repo: Path) -> None:
    text = ('backend: "python"\nmax_batch_size: 4\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] '
            'reshape { shape: [ ] } }, { name: "B" data_type: TYPE_FP32 dims: [ -1, 2 ] '
            'reshape { shape: [ -1, 1, 2 ] } } ]')
    cfg = norm(repo, "m", text)
    assert list(cfg.input[0].reshape.shape) == [] and cfg.input[0].HasField("reshape")


def test_model_without_io_is_allowed(repo: Path) -> None:
    # Triton 2.51 loads a Python model whose config (and auto-complete) gives no inputs or outputs.
    cfg = norm(repo, "noio", 'backend: "python"\n')
    assert not cfg.input and not cfg.output
