"""A bound model's configuration as written for the server (inferd.pytriton.model_spec), read back by the
server's own parser, and the API's argument checks."""

from __future__ import annotations

import numpy as np
import pytest
from inferd.pytriton.exceptions import PyTritonBadParameterError, PyTritonModelConfigError
from inferd.pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from inferd.pytriton.model_spec import BoundModel, to_pbtxt
from inferd.pytriton.triton import TritonConfig, server_flags
from inferd.supervisor.repository.config import parse_pbtxt, to_json_dict


def bound(config: ModelConfig, funcs=None) -> BoundModel:
    return BoundModel.create("m", funcs or [lambda r: r, lambda r: r],
                             [Tensor(name="A", dtype=np.float32, shape=(-1, 3)),
                              Tensor(dtype=np.bytes_, shape=(1,), optional=True)],
                             [Tensor(name="OUT", dtype=np.int64, shape=(2,))], config, False)


def test_every_config_field_reaches_the_server_parser():
    policy = QueuePolicy(timeout_action=TimeoutAction.DELAY, default_timeout_microseconds=500,
                         allow_timeout_override=True, max_queue_size=7)
    cfg = ModelConfig(max_batch_size=8, decoupled=True, response_cache=True, batcher=DynamicBatcher(
        max_queue_delay_microseconds=300, preferred_batch_size=[2, 4], preserve_ordering=True, priority_levels=2,
        default_priority_level=1, default_queue_policy=policy, priority_queue_policy={2: policy}))
    doc = to_json_dict(parse_pbtxt(to_pbtxt(bound(cfg).config_dict())))
    assert doc["backend"] == "external" and doc["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in doc["input"]] == [
        ("A", "TYPE_FP32", [-1, 3]), ("INPUT_2", "TYPE_STRING", [1])]
    assert doc["input"][1]["optional"] is True
    assert doc["output"][0]["data_type"] == "TYPE_INT64"
    assert doc["instance_group"][0]["count"] == 2  # one instance per callable
    batching = doc["dynamic_batching"]
    assert batching["preferred_batch_size"] == [2, 4] and batching["preserve_ordering"] is True
    assert int(batching["max_queue_delay_microseconds"]) == 300
    assert batching["default_queue_policy"]["timeout_action"] == "DELAY"
    assert batching["priority_queue_policy"]["2"]["max_queue_size"] == 7
    assert doc["model_transaction_policy"]["decoupled"] is True
    assert doc["response_cache"]["enable"] is True


def test_no_batching_means_max_batch_size_0_and_no_batcher():
    doc = bound(ModelConfig(batching=False)).config_dict()
    assert doc["max_batch_size"] == 0 and "dynamic_batching" not in doc


@pytest.mark.parametrize("args, error", [
    (dict(name="bad name"), PyTritonBadParameterError),
    (dict(funcs=["not callable"]), PyTritonBadParameterError),
    (dict(config=ModelConfig(max_batch_size=0)), PyTritonModelConfigError),
    (dict(dtype=np.complex64), PyTritonBadParameterError),
])
def test_bad_bind_arguments_are_refused(args, error):
    with pytest.raises(error):
        BoundModel.create(args.get("name", "m"), args.get("funcs", lambda r: r),
                          [Tensor(name="A", dtype=args.get("dtype", np.float32), shape=(1,))],
                          [Tensor(name="B", dtype=np.float32, shape=(1,))], args.get("config"), False)


def test_triton_config_flags_and_environment(monkeypatch):
    flags = server_flags(TritonConfig(http_port=1, allow_grpc=False, log_verbose=2, id="x",
                                      http_restricted_api="model-repository:k=v;trace:k=v"))
    assert {"--http-port=1", "--allow-grpc=false", "--log-verbose=2", "--id=x"} <= set(flags)
    assert "--http-restricted-api=model-repository:k=v" in flags and "--http-restricted-api=trace:k=v" in flags
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "4545")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "false")
    cfg = TritonConfig.from_env()
    assert cfg.grpc_port == 4545 and cfg.allow_metrics is False
