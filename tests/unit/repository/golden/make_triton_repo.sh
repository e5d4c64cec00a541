#!/usr/bin/env bash
# Builds the model repository the golden files were taken from (real Triton 2.51, Python backend, CPU):
#   ./make_triton_repo.sh /tmp/somewhere
#   /work/shared/tools/triton_reference.sh run --model-repository /tmp/somewhere --exit-on-error=false \
#       --http-port 18470 --grpc-port 18471 --metrics-port 18472
#   curl localhost:18470/v2/models/<m>/config   (repository path replaced by @REPO@ in the golden files)
set -eu
R=${1:?target directory}
mkdir -p "$R"; cd "$R"
mk() { mkdir -p "$1/1"; cat > "$1/1/model.py" <<'EOF'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
EOF
}
mk add_sub; cat > add_sub/config.pbtxt <<'EOF'
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
EOF
mk auto_all; cat > auto_all/1/model.py <<'EOF'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=False))
        return auto_complete_model_config

    def initialize(self, args):
        pass

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
EOF
mk full; mkdir -p full/2 full/3; cp full/1/model.py full/2/; cp full/1/model.py full/3/
cat > full/config.pbtxt <<'EOF'
backend: "python"
max_batch_size: 16
version_policy: { specific: { versions: [1, 3] } }
input [
  { name: "IN0" data_type: TYPE_INT64 dims: [ -1, 2 ] reshape: { shape: [ -1, 1, 2 ] } },
  { name: "IN1" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } optional: true },
  { name: "IN2" data_type: TYPE_BOOL format: FORMAT_NCHW dims: [ 3, 2, 2 ] allow_ragged_batch: true }
]
output [
  { name: "OUT0" data_type: TYPE_FP16 dims: [ 5 ] label_filename: "labels.txt" }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 10 }
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 7000 max_queue_size: 3 } }
}
instance_group [
  { name: "grp" count: 1 kind: KIND_CPU },
  { kind: KIND_CPU },
  { count: 3 kind: KIND_AUTO }
]
optimization {
  priority: PRIORITY_MAX
  cuda { graphs: true graph_spec [ { batch_size: 2 input { key: "IN0" value { dim: [ 2, 2 ] } } } ] }
}
parameters { key: "foo" value { string_value: "bar" } }
parameters { key: "OTHER_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env" } }
metric_tags { key: "team" value: "a" }
response_cache { enable: false }
EOF
printf 'a\nb\n' > full/labels.txt
mk seq; cat > seq/config.pbtxt <<'EOF'
backend: "python"
max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 300 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
EOF
mk seqdirect; cat > seqdirect/config.pbtxt <<'EOF'
backend: "python"
max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { max_queue_delay_microseconds: 400 minimum_slot_utilization: 0.5 }
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: [ { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "init" } ] } ]
}
EOF
mkdir -p ens/1; cat > ens/config.pbtxt <<'EOF'
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "S" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [ { model_name: "add_sub" model_version: -1 input_map { key: "INPUT0" value: "A" }
           input_map { key: "INPUT1" value: "B" } output_map { key: "OUTPUT0" value: "S" } } ]
}
EOF
mk gpu_kind; cat > gpu_kind/config.pbtxt <<'EOF'
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_GPU } ]
EOF
mk noio; echo 'backend: "python"' > noio/config.pbtxt
mk noconfig_plain
mk badname; cat > badname/config.pbtxt <<'EOF'
name: "othername"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
EOF
mk spec_missing; cat > spec_missing/config.pbtxt <<'EOF'
backend: "python"
version_policy { specific { versions: [ 1, 3 ] } }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
EOF
mk mbs0_db; cat > mbs0_db/config.pbtxt <<'EOF'
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
EOF
mk secdev; cat > secdev/config.pbtxt <<'EOF'
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU secondary_devices [ { kind: KIND_NVDLA device_id: 1 } ] } ]
EOF
mk emptydims; cat > emptydims/config.pbtxt <<'EOF'
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
EOF
mk dupin; cat > dupin/config.pbtxt <<'EOF'
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
EOF
mk parseerr; printf 'backend: "python"\ninput [ { name: "IN" data_type: TYPE_INT32 dimz: [ 1 ] } ]\n' > parseerr/config.pbtxt
mk pref_big; cat > pref_big/config.pbtxt <<'EOF'
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 8 ] }
EOF
mk auto_mbs_change; cat > auto_mbs_change/config.pbtxt <<'EOF'
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
EOF
cat > auto_mbs_change/1/model.py <<'EOF'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(c):
        c.set_max_batch_size(6)
        return c

    def initialize(self, args):
        pass

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
EOF
mk warm; cat > warm/config.pbtxt <<'EOF'
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2, 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_warmup [ { name: "w" batch_size: 1 count: 2 inputs { key: "IN" value { data_type: TYPE_INT32 dims: [ 2, 2 ] zero_data: true } } } ]
EOF
mkdir -p onnxish/1 && touch onnxish/1/model.onnx
mkdir -p 0lead/01 && cp add_sub/1/model.py 0lead/01/
for v in 1 2 010 abc 0; do mkdir -p versions_mixed/$v; cp add_sub/1/model.py versions_mixed/$v/; done
echo 'backend: "python"' > versions_mixed/config.pbtxt
echo 'version_policy { all { } }' >> versions_mixed/config.pbtxt
echo 'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]' >> versions_mixed/config.pbtxt
