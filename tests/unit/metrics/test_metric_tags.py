"""metric_tags in a model config: labels "_<key>" on every per-model metric (as Triton 2.51 writes them), and
the keys that cannot make a label refused at load (Triton 2.51 aborts the server on one)."""

from __future__ import annotations

import pytest
from inferd.supervisor.metrics.endpoint import ExtraMetrics, render_metrics
from inferd.supervisor.metrics.model_statistics import StatsRegistry
from inferd.supervisor.metrics.server_families import InstanceMetrics
from inferd.supervisor.repository import config as repo_config
from inferd.worker.wire.errors import InferdError
from prometheus_client.parser import text_string_to_metric_families


def test_metric_tags_label_every_per_model_metric():
    stats = StatsRegistry()
    s = stats.get("probe", 1)
    s.metric_tags = (("tier", "gold"), ("team", 'vi"sion'))
    s.cache_enabled = True
    stats.get("plain", 1)
    extra = ExtraMetrics(instances=[InstanceMetrics("probe", "1", "probe_0", "ready")])
    text = render_metrics(stats, extra=lambda: extra, system=False).decode()
    tags = '_team="vi\\"sion",_tier="gold",'
    assert f'nv_inference_count{{{tags}model="probe",version="1"}} 0' in text
    assert f'nv_inference_request_failure{{{tags}model="probe",reason="BACKEND",version="1"}} 0' in text
    assert f'nv_cache_num_hits_per_model{{{tags}model="probe",version="1"}} 0' in text
    restarts = f'inferd_instance_restarts_total{{{tags}instance="probe_0",model="probe",reason="memory",version="1"}}'
    assert f'{restarts} 0' in text
    assert 'nv_inference_count{model="plain",version="1"} 0' in text
    text_string_to_metric_families(text)  # valid exposition


@pytest.mark.parametrize("key", ["bad-key", "_under", "ünï", "k" * 200])
def test_metric_tags_keys_must_make_labels(key):
    cfg = repo_config.parse_pbtxt('name: "m"\nbackend: "python"\nmetric_tags { key: "%s" value: "x" }' % key)
    with pytest.raises(InferdError, match="metric_tags key .* does not make a valid metric label"):
        repo_config.validate(cfg)


def test_metric_tags_bounds_and_good_keys():
    good = repo_config.parse_pbtxt('name: "m"\nbackend: "python"\nmetric_tags { key: "team" value: "x" }\n'
                                   'metric_tags { key: "9lives" value: "" }\nmetric_tags { key: "" value: "y" }')
    repo_config.validate(good)
    many = "".join('metric_tags { key: "k%d" value: "x" }\n' % i for i in range(33))
    with pytest.raises(InferdError, match="at most 32"):
        repo_config.validate(repo_config.parse_pbtxt('name: "m"\nbackend: "python"\n' + many))
    long_value = repo_config.parse_pbtxt('name: "m"\nbackend: "python"\nmetric_tags { key: "k" value: "%s" }'
                                         % ("v" * 1025))
    with pytest.raises(InferdError, match="longer than 1024"):
        repo_config.validate(long_value)
