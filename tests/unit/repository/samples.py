"""Real-world style config.pbtxt samples (shapes of configs seen in Triton's docs and users' repositories)."""

DENSENET_ONNX = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""

SIMPLE_SEQUENCE = """
# a stateful accumulator
name: "simple_sequence"
backend: "python"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START  int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ENSEMBLE = """
name: "ensemble_model"
platform: "ensemble"
max_batch_size: 1
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "CLASSIFICATION" data_type: TYPE_FP32 dims: [ 1000 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "INPUT_0" value: "IMAGE" }
      output_map { key: "OUTPUT_0" value: "preprocessed_image" }
    },
    {
      model_name: "densenet_onnx"
      model_version: 1
      input_map { key: "data_0" value: "preprocessed_image" }
      output_map { key: "fc6_1" value: "CLASSIFICATION" }
    }
  ]
}
"""

LLM_DECOUPLED = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_MODEL } ]
parameters: {
  key: "EXECUTION_ENV_PATH",
  value: {string_value: "$$TRITON_MODEL_DIRECTORY/python_env.tar.gz"}
}
parameters: { key: "max_tokens" value: { string_value: "512" } }
"""

RESNET_TRT = """
name: "resnet50_trt"
platform: "tensorrt_plan"
max_batch_size: 32
input { name: "input" data_type: TYPE_FP16 dims: [ 3, 224, 224 ] }
output { name: "output" data_type: TYPE_FP16 dims: [ 1000 ] }
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 500
  default_queue_policy { max_queue_size: 64 }
}
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
cc_model_filenames { key: "8.0" value: "model_a100.plan" }
model_warmup [
  {
    name: "zeros"
    batch_size: 8
    inputs { key: "input" value { data_type: TYPE_FP16 dims: [ 3, 224, 224 ] zero_data: true } }
  }
]
"""

TORCHSCRIPT = """
name: "bert_pt"
backend: "pytorch"
max_batch_size: 16
input [
  { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 128 ] },
  { name: "INPUT__1" data_type: TYPE_INT64 dims: [ 128 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { }
version_policy: { latest: { num_versions: 2 } }
optimization { execution_accelerators {
  gpu_execution_accelerator : [ { name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ]
} }
"""

ALL = {
    "densenet_onnx": DENSENET_ONNX,
    "simple_sequence": SIMPLE_SEQUENCE,
    "ensemble_model": ENSEMBLE,
    "llm": LLM_DECOUPLED,
    "resnet50_trt": RESNET_TRT,
    "bert_pt": TORCHSCRIPT,
}
