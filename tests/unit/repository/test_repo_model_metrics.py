"""model_metrics (Triton 2.52 and later): each metric_control checked at load with Triton's messages (its
model_config_utils.cc ValidateModelMetrics; Triton 2.51 does not know the field), and kept in the config."""

from __future__ import annotations

from pathlib import Path

import pytest
from inferd.supervisor.repository import config as C
from inferd.supervisor.repository import layout
from inferd.worker.wire.errors import ErrorCode, InferdError

from .conftest import write_model

BASE = """backend: "python"
max_batch_size: 0
input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
FAMILY = 'metric_identifier { family: "nv_inference_first_response_histogram_ms" }'


def load(repo: Path, extra: str):
    write_model(repo, "m", BASE + extra)
    src = layout.read_model(str(repo), "m")
    return C.normalize(C.load_config(src), src)


@pytest.mark.parametrize("control, message", [
    ("histogram_options { buckets: [ 1 ] }", "metric control must specify 'metric_identifier'"),
    ('metric_identifier { family: "" } histogram_options { buckets: [ 1 ] }',
     "metric identifier must specify non-empty 'family'"),
    (FAMILY, "metric control must specify 'histogram_options'"),
    (FAMILY + " histogram_options { }", "histogram options must specify non-empty 'buckets'"),
])
def test_incomplete_metric_control_fails_the_load_with_tritons_message(repo, control, message):
    with pytest.raises(InferdError) as info:
        load(repo, f"model_metrics {{ metric_control [ {{ {control} }} ] }}\n")
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == message


def test_model_metrics_is_kept_in_the_config(repo):
    cfg = load(repo, f"model_metrics {{ metric_control [ {{ {FAMILY} histogram_options {{ buckets: [ 1, 2.5 ] }} }},"
                     ' { metric_identifier { family: "other" } histogram_options { buckets: [ 3 ] } } ] }\n')
    assert C.to_json_dict(cfg)["model_metrics"] == {"metric_control": [
        {"metric_identifier": {"family": "nv_inference_first_response_histogram_ms"},
         "histogram_options": {"buckets": [1.0, 2.5]}},
        {"metric_identifier": {"family": "other"}, "histogram_options": {"buckets": [3.0]}}]}
