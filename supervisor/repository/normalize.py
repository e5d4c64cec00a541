"""Config normalisation (triton.md §3.10, §3.4, §4.2) and validation.

`normalize` only fills what is unset, so it is idempotent: the model manager runs it once before a
backend's auto-complete (the worker sees a filled config) and once after (defaults that depend on what
auto-complete set, e.g. `preferred_batch_size: [max_batch_size]`, appear then, as in Triton).

Error messages reuse Triton's wording where it was observed (tests/unit/repository/golden/README.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.worker.wire import metric_rules as rules
from inferd.worker.wire.errors import invalid_arg

from .batch_io import validate_batch_io
from .layout import ModelSource

SEQUENCE_IDLE_DEFAULT_US = 1_000_000
MODEL_DIR_VAR = "$$TRITON_MODEL_DIRECTORY"
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
ENSEMBLE = "ensemble"

# platform -> backend
PLATFORM_BACKEND = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}
# default model file -> (backend, platform); order = detection order in a version directory
DEFAULT_FILES: tuple[tuple[str, str, str], ...] = (
    ("model.plan", "tensorrt", "tensorrt_plan"),
    ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
    ("model.pt", "pytorch", "pytorch_libtorch"),
    ("model.pt2", "pytorch", "torch_aoti"),
    ("model.savedmodel", "tensorflow", "tensorflow_savedmodel"),
    ("model.graphdef", "tensorflow", "tensorflow_graphdef"),
    ("model.xml", "openvino", ""),
    ("model.dali", "dali", ""),
    ("model.py", "python", ""),
)
_PLATFORM_FILE = {platform: f for f, _, platform in DEFAULT_FILES if platform}
_BACKEND_FILE = {"tensorrt": "model.plan", "onnxruntime": "model.onnx", "pytorch": "model.pt",
                 "openvino": "model.xml", "dali": "model.dali", "python": "model.py"}
_BACKEND_PLATFORM = {
    "tensorrt": "tensorrt_plan", "onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch",
}
_EXT_BACKEND = {f.rsplit(".", 1)[1]: (b, p) for f, b, p in DEFAULT_FILES}
_CPU_COUNT_2_BACKENDS = ("onnxruntime", "tensorflow")

KIND_AUTO = mc.ModelInstanceGroup.KIND_AUTO
KIND_GPU = mc.ModelInstanceGroup.KIND_GPU
KIND_CPU = mc.ModelInstanceGroup.KIND_CPU


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == ENSEMBLE or config.HasField("ensemble_scheduling")


def set_name(config: mc.ModelConfig, dir_name: str) -> None:
    """name := directory name; a different name in the config is an error."""
    if not config.name:
        config.name = dir_name
    elif config.name != dir_name:
        raise invalid_arg(
            f"unexpected directory name '{dir_name}' for model '{config.name}', "
            "directory name must equal model name"
        )


def _detect_file(source: ModelSource, filename: str) -> tuple[str, str] | None:
    """(backend, platform) from the model files in the version directories, lowest version first."""
    for v in source.versions:
        vdir = source.version_path(v)
        if filename:
            if os.path.exists(os.path.join(vdir, filename)):
                ext = filename.rsplit(".", 1)[-1] if "." in filename else ""
                if ext in _EXT_BACKEND:
                    return _EXT_BACKEND[ext]
            continue
        for f, backend, platform in DEFAULT_FILES:
            if os.path.exists(os.path.join(vdir, f)):
                return backend, platform
    return None


def fill_backend_fields(config: mc.ModelConfig, source: ModelSource, backend_hint: str = "") -> None:
    """backend / platform / default_model_filename from the config, the model files, or `backend_hint`."""
    if config.HasField("ensemble_scheduling") and not config.platform and not config.backend:
        config.platform = ENSEMBLE
    if config.platform == ENSEMBLE:
        return
    if config.platform and not config.backend:
        config.backend = PLATFORM_BACKEND.get(config.platform, "")
    if not config.backend and not config.platform:
        found = _detect_file(source, config.default_model_filename)
        if found is None and config.default_model_filename:
            found = _detect_file(source, "")
        if found is not None:
            config.backend, config.platform = found
        elif backend_hint:
            config.backend = backend_hint
        else:
            raise invalid_arg(
                f"unable to determine the backend of model '{source.name}': its configuration names no "
                "'backend' or 'platform' and no version directory holds a known model file "
                f"({', '.join(f for f, _, _ in DEFAULT_FILES)})"
            )
    if config.backend and not config.platform and config.backend in _BACKEND_PLATFORM:
        config.platform = _BACKEND_PLATFORM[config.backend]
    if not config.default_model_filename:
        config.default_model_filename = (
            _PLATFORM_FILE.get(config.platform) or _BACKEND_FILE.get(config.backend, "")
        )


def _normalize_batching(config: mc.ModelConfig) -> None:
    mbs = config.max_batch_size
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        if not db.preferred_batch_size and mbs > 0:
            db.preferred_batch_size.append(mbs)
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and mbs > 0:
            sb.oldest.preferred_batch_size.append(mbs)


def _normalize_instance_groups(config: mc.ModelConfig, gpus: Sequence[int]) -> None:
    if is_ensemble(config):
        return
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.kind == KIND_AUTO:
            usable = bool(gpus) and all(g in gpus for g in group.gpus)
            group.kind = KIND_GPU if usable else KIND_CPU
        if group.count < 1:
            cpu2 = group.kind == KIND_CPU and config.backend in _CPU_COUNT_2_BACKENDS
            group.count = 2 if cpu2 else 1
        if group.kind == KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def _substitute_model_dir(config: mc.ModelConfig, model_path: str) -> None:
    if EXECUTION_ENV_PATH in config.parameters:
        p = config.parameters[EXECUTION_ENV_PATH]
        if p.string_value.startswith(MODEL_DIR_VAR):
            p.string_value = model_path + p.string_value[len(MODEL_DIR_VAR):]


def normalize(
    config: mc.ModelConfig,
    source: ModelSource,
    backend_hint: str = "",
    *,
    has_gpu: bool = False,
    gpu_ids: Sequence[int] | None = None,
) -> mc.ModelConfig:
    """A normalised, validated copy of `config` (triton.md §3.10). INVALID_ARG when it is not servable.

    GPUs: `gpu_ids` lists the usable devices; when omitted, `has_gpu=True` means one GPU, id 0.
    """
    gpus = list(gpu_ids) if gpu_ids is not None else ([0] if has_gpu else [])
    cfg = mc.ModelConfig()
    cfg.CopyFrom(config)
    set_name(cfg, source.name)
    fill_backend_fields(cfg, source, backend_hint)
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    _normalize_batching(cfg)
    if is_ensemble(cfg):
        if not cfg.HasField("model_transaction_policy"):
            cfg.model_transaction_policy.decoupled = False
    else:
        opt = cfg.optimization
        if not opt.HasField("input_pinned_memory"):
            opt.input_pinned_memory.enable = True
        if not opt.HasField("output_pinned_memory"):
            opt.output_pinned_memory.enable = True
        _normalize_instance_groups(cfg, gpus)
    _substitute_model_dir(cfg, source.path)
    validate(cfg, gpu_ids=gpus)
    return cfg


# ---- validation ------------------------------------------------------------------------------------------


def _validate_io(config: mc.ModelConfig) -> None:
    m = config.name
    for kind, ios in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for io in ios:
            if not io.name:
                raise invalid_arg(f"model {kind} must specify 'name' for {m}")
            if io.name in seen:
                raise invalid_arg(f"model {kind} '{io.name}' is specified more than once for {m}")
            seen.add(io.name)
            if io.data_type == mc.TYPE_INVALID or io.data_type not in mc.DataType.values():
                raise invalid_arg(f"model {kind} '{io.name}' must specify 'data_type' for {m}")
            if not io.dims:
                raise invalid_arg(f"model {kind} '{io.name}' must specify 'dims' for {m}")
            for d in io.dims:
                if d < 1 and d != -1:
                    raise invalid_arg(
                        f"model {kind} '{io.name}' dimension must be integer >= 1, or -1 to indicate "
                        f"a variable-size dimension for {m}")
            if io.HasField("reshape"):
                _validate_reshape(kind, io.name, list(io.dims), list(io.reshape.shape), m)


def _validate_reshape(kind: str, name: str, dims: list[int], shape: list[int], model: str) -> None:
    for d in shape:
        if d < 1 and d != -1:
            raise invalid_arg(f"model {kind} '{name}' reshape dimension must be integer >= 1, or -1 to "
                              f"indicate a variable-size dimension for {model}")
    if dims.count(-1) != shape.count(-1) and (dims.count(-1) == 0 or shape.count(-1) == 0):
        raise invalid_arg(f"model {kind} '{name}' has different number of variable-size dimensions for "
                          f"dims and reshape for {model}")
    if -1 not in dims and -1 not in shape:
        n_dims, n_shape = 1, 1
        for d in dims:
            n_dims *= d
        for d in shape:
            n_shape *= d
        if n_dims != n_shape:
            raise invalid_arg(f"model {kind} '{name}' has different size for dims and reshape for {model}")


def _validate_preferred(sizes: Sequence[int], mbs: int, what: str, m: str) -> None:
    for s in sizes:
        if s < 1:
            raise invalid_arg(f"{what} preferred size must be positive for {m}")
        if mbs > 0 and s > mbs:
            raise invalid_arg(f"{what} preferred size must be <= max batch size for {m}")


def _validate_dynamic_batching(config: mc.ModelConfig) -> None:
    db, m = config.dynamic_batching, config.name
    _validate_preferred(db.preferred_batch_size, config.max_batch_size, "dynamic batching", m)
    if db.preserve_ordering and db.priority_levels > 1:
        raise invalid_arg(f"Only one priority level is allowed when 'preserve_ordering' is true for {m}")
    if db.priority_levels > 0:
        if not 1 <= db.default_priority_level <= db.priority_levels:
            raise invalid_arg(
                f"default priority level must be in range [1, {db.priority_levels}] for {m}")
        for level in db.priority_queue_policy:
            if not 1 <= level <= db.priority_levels:
                raise invalid_arg("priority queue policy must have priority level in range "
                                  f"[1, {db.priority_levels}] for {m}")
    elif db.priority_queue_policy:
        raise invalid_arg(f"priority queue policy requires 'priority_levels' > 0 for {m}")


def _validate_sequence_batching(config: mc.ModelConfig) -> None:
    sb, m = config.sequence_batching, config.name
    if sb.HasField("oldest"):
        _validate_preferred(sb.oldest.preferred_batch_size, config.max_batch_size,
                            "sequence batching oldest", m)
        if sb.oldest.max_candidate_sequences < 0:
            raise invalid_arg(f"sequence batching oldest 'max_candidate_sequences' must be >= 0 for {m}")
    names: set[str] = set()
    control = mc.ModelSequenceBatching.Control
    for ci in sb.control_input:
        if not ci.name:
            raise invalid_arg(f"sequence batching control input must specify 'name' for {m}")
        if ci.name in names:
            raise invalid_arg(
                f"sequence batching control input '{ci.name}' is specified more than once for {m}")
        names.add(ci.name)
        for c in ci.control:
            if c.kind == control.CONTROL_SEQUENCE_CORRID:
                if c.data_type not in (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32,
                                       mc.TYPE_STRING):
                    raise invalid_arg(f"sequence batching control input '{ci.name}' "
                                      "CONTROL_SEQUENCE_CORRID must specify a 'data_type' of TYPE_UINT64, "
                                      f"TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING for {m}")
                continue
            given = [x for x in (c.int32_false_true, c.fp32_false_true, c.bool_false_true) if len(x)]
            if len(given) != 1 or len(given[0]) != 2:
                raise invalid_arg(f"sequence batching control input '{ci.name}' must specify exactly one of "
                                  "'int32_false_true', 'fp32_false_true' or 'bool_false_true' with two "
                                  f"values for {m}")


def _validate_ensemble(config: mc.ModelConfig) -> None:
    m = config.name
    if config.platform != ENSEMBLE:
        raise invalid_arg(
            f"ensemble scheduling cannot be set for model '{m}' whose platform is not {ENSEMBLE}")
    if not config.HasField("ensemble_scheduling"):
        raise invalid_arg(f"ensemble scheduling must be set for ensemble '{m}' whose platform is {ENSEMBLE}")
    if config.instance_group:
        raise invalid_arg(f"instance group should not be specified for ensemble '{m}'")
    if not config.ensemble_scheduling.step:
        raise invalid_arg(f"must specify one or more 'step's for ensemble '{m}'")
    for i, step in enumerate(config.ensemble_scheduling.step):
        if not step.model_name:
            raise invalid_arg(f"must specify 'model_name' in step {i} of ensemble '{m}'")


def _validate_instance_groups(config: mc.ModelConfig, gpus: Sequence[int]) -> None:
    m = config.name
    for g in config.instance_group:
        if g.kind == KIND_GPU:
            if not gpus:
                raise invalid_arg(
                    f"instance group {g.name} of model {m} has kind KIND_GPU but no GPUs are available")
            for gid in g.gpus:
                if gid not in gpus:
                    raise invalid_arg(
                        f"instance group {g.name} of model {m} specifies invalid or unsupported gpu id "
                        f"{gid}. GPUs available: {' '.join(map(str, gpus))}")
        elif g.kind == KIND_CPU and g.gpus:
            raise invalid_arg(
                f"instance group {g.name} of model {m} has kind KIND_CPU but specifies one or more GPUs")


MAX_METRIC_TAGS = 32
_TAG_KEY = re.compile(r"(?:[a-zA-Z0-9][a-zA-Z0-9_]*)?\Z")  # "_" + key: a label name not starting with "__"


def _validate_metric_tags(config: mc.ModelConfig) -> None:
    """metric_tags become labels "_<key>" on the model's metrics: each must make a valid label (Triton 2.51
    aborts the whole server on one that does not)."""
    m = config.name
    tags = config.metric_tags
    if len(tags) > MAX_METRIC_TAGS:
        raise invalid_arg(f"model {m} has {len(tags)} metric_tags; at most {MAX_METRIC_TAGS} are allowed")
    for key, value in tags.items():
        if len(key) > rules.MAX_NAME_CHARS - 1 or not _TAG_KEY.match(key):
            raise invalid_arg(
                f"metric_tags key '{key[:60]}' of model {m} does not make a valid metric label: '_<key>' must "
                f"match [a-zA-Z_][a-zA-Z0-9_]* (at most {rules.MAX_NAME_CHARS} characters) and not start with '__'")
        if len(value) > rules.MAX_LABEL_VALUE_CHARS:
            raise invalid_arg(f"metric_tags value of '{key}' in model {m} is longer than "
                              f"{rules.MAX_LABEL_VALUE_CHARS} characters")


def _validate_model_metrics(config: mc.ModelConfig) -> None:
    """model_metrics (Triton 2.52 and later): each metric_control names a family and gives histogram buckets;
    Triton's messages. (Which families and which buckets: latency_histogram.bucket_overrides, at load.)"""
    for control in config.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise invalid_arg("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise invalid_arg("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise invalid_arg("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise invalid_arg("histogram options must specify non-empty 'buckets'")


def validate(config: mc.ModelConfig, gpu_ids: Sequence[int] = ()) -> None:
    """INVALID_ARG when a normalised config cannot be served."""
    m = config.name
    if not m:
        raise invalid_arg("model configuration must specify 'name'")
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {m}")
    if not config.platform and not config.backend:
        raise invalid_arg(f"must specify 'platform' or 'backend' for '{m}'")
    if is_ensemble(config):
        _validate_ensemble(config)
    else:
        _validate_instance_groups(config, gpu_ids)
    _validate_io(config)
    _validate_metric_tags(config)
    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)
    validate_batch_io(config)
    _validate_model_metrics(config)
