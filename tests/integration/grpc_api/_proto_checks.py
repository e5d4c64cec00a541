"""Checks of our generated protos, run by test_proto_compat.py in a fresh interpreter.

Kept out of the pytest process, which imports tritonclient.grpc for the frontend tests.
"""

from __future__ import annotations


def check_health_proto() -> None:
    from inferd.supervisor._gen import health_pb2, health_pb2_grpc

    assert health_pb2.DESCRIPTOR.package == "grpc.health.v1"
    assert health_pb2.HealthCheckResponse.SERVING == 1
    assert health_pb2.HealthCheckResponse.NOT_SERVING == 2
    assert hasattr(health_pb2_grpc, "HealthStub")


CONFIG_PBTXT = r"""
name: "ensemble_seq"
platform: "ensemble"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] reshape: { shape: [ ] } },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "labels.txt" } ]
instance_group [
  { name: "g0" count: 2 kind: KIND_GPU gpus: [ 0, 1 ]
    rate_limiter { resources [ { name: "R1" count: 4 } ] priority: 2 } },
  { count: 1 kind: KIND_CPU }
]
parameters: { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
optimization { input_pinned_memory { enable: true } cuda { graphs: true } }
model_transaction_policy { decoupled: false }
response_cache { enable: true }
model_warmup [ { name: "w" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [16] zero_data: true } } } ]
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1 input_map { key: "IN" value: "INPUT0" }
      output_map { key: "OUT" value: "mid" } },
    { model_name: "post" model_version: 2 input_map { key: "IN" value: "mid" }
      output_map { key: "OUT" value: "OUTPUT0" } }
  ]
}
"""

SEQUENCE_PBTXT = """
name: "seq"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "init" } } ]
}
"""

DYNAMIC_PBTXT = """
name: "add_sub"
backend: "python"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 max_queue_size: 16 }
  priority_queue_policy { key: 1 value: { allow_timeout_override: true } }
}
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def check_parse_realistic_config_pbtxt() -> None:
    from google.protobuf import json_format, text_format
    from inferd.supervisor._gen import model_config_pb2 as mc

    cfg = text_format.Parse(CONFIG_PBTXT, mc.ModelConfig())
    assert cfg.WhichOneof("scheduling_choice") == "ensemble_scheduling"
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value.startswith("$$TRITON_MODEL_DIRECTORY")
    assert cfg.ensemble_scheduling.step[1].output_map["OUT"] == "OUTPUT0"
    assert cfg.instance_group[0].rate_limiter.resources[0].count == 4
    assert list(cfg.input[0].dims) == [-1, 16] and cfg.input[0].HasField("reshape")
    assert cfg.model_warmup[0].inputs["INPUT0"].zero_data

    seq = text_format.Parse(SEQUENCE_PBTXT, mc.ModelConfig())
    sb = seq.sequence_batching
    assert sb.WhichOneof("strategy_choice") == "oldest"
    assert sb.control_input[2].control[0].kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
    assert sb.control_input[2].control[0].data_type == mc.TYPE_UINT64
    assert sb.state[0].initial_state[0].zero_data

    dyn = text_format.Parse(DYNAMIC_PBTXT, mc.ModelConfig())
    assert dyn.dynamic_batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY
    assert dyn.dynamic_batching.priority_queue_policy[1].allow_timeout_override
    # The JSON rendering round-trips through ParseDict (the gRPC ModelConfig RPC path).
    as_json = json_format.MessageToDict(dyn, preserving_proto_field_name=True)
    assert json_format.ParseDict(as_json, mc.ModelConfig()) == dyn


if __name__ == "__main__":
    check_health_proto()
    check_parse_realistic_config_pbtxt()
    print("ok")
