"""deploy/kubernetes: every overlay rendered with `kubectl kustomize`, validated offline against
the Kubernetes schemas (kubernetes-validate, strict) and checked for torchport's invariants."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.crd_schemas import BY_KIND
from tests.deploy.settings_names import known_variables

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "prod")
TARGETS = ("base", *(f"overlays/{name}" for name in OVERLAYS))
# The oldest and a recent Kubernetes release the manifests must be valid for.
KUBERNETES_VERSIONS = ("1.28", "1.33")
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
CLUSTER_SCOPED = {"Namespace", "RuntimeClass"}
SECRETISH = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|DATABASE_URL|BROKER_URL|TOKEN", re.I)


def _render(target: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (Debian package `kubernetes-client`)"
    out = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {target: _render(target) for target in TARGETS}


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# ------------------------------------------------------------------ schema validation


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_resource_is_valid(
    rendered: dict[str, list[dict[str, Any]]], target: str, version: str
) -> None:
    docs = rendered[target]
    assert docs
    checked = 0
    for doc in docs:
        crd_schema = BY_KIND.get((doc["apiVersion"], doc["kind"]))
        if crd_schema is not None:
            jsonschema.validate(doc, crd_schema)
        else:
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked == len(docs)


def test_every_manifest_file_is_part_of_a_rendered_kustomization() -> None:
    referenced: set[Path] = set()
    for kustomization in KUBERNETES.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        for key in ("resources", "patchesStrategicMerge"):
            for entry in spec.get(key, []):
                path = (kustomization.parent / entry).resolve()
                if path.is_file():
                    referenced.add(path)
    files = {p.resolve() for p in KUBERNETES.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert files - referenced == set()


# ------------------------------------------------------------------ pod security


@pytest.mark.parametrize("target", TARGETS)
def test_pods_meet_the_restricted_pod_security_standard(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    pods = list(_pod_specs(rendered[target]))
    assert pods
    for name, pod in pods:
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name
        for container in _containers(pod):
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            assert "add" not in security["capabilities"], name
            assert security.get("privileged", False) is False, name
            assert container["resources"]["limits"]["memory"], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_namespace_enforces_restricted_and_holds_everything(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[f"overlays/{overlay}"]
    (namespace,) = _by_kind(docs, "Namespace").values()
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for doc in docs:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], doc["kind"]


def test_service_account_mounts_no_token(rendered: dict[str, list[dict[str, Any]]]) -> None:
    accounts = _by_kind(rendered["base"], "ServiceAccount")
    assert accounts["torchport"]["automountServiceAccountToken"] is False
    for name, pod in _pod_specs(rendered["base"]):
        assert pod["serviceAccountName"] == "torchport", name


# ------------------------------------------------------------------ secrets


@pytest.mark.parametrize("target", TARGETS)
def test_secrets_are_referenced_never_inlined(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    assert _by_kind(docs, "Secret") == {}
    referenced = 0
    for name, pod in _pod_specs(docs):
        for container in _containers(pod):
            for env in container.get("env", []):
                if SECRETISH.search(env["name"]):
                    assert "value" not in env, f"{name}: {env['name']}"
                    assert env["valueFrom"]["secretKeyRef"]["name"] == "torchport-secrets"
                    referenced += 1
    assert referenced > 0
    for config in _by_kind(docs, "ConfigMap").values():
        assert not [key for key in config["data"] if SECRETISH.search(key)]


@pytest.mark.parametrize("target", TARGETS)
def test_torchport_variables_are_read_by_a_settings_class(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    used = {key for config in _by_kind(docs, "ConfigMap").values() for key in config["data"]} | {
        env["name"]
        for _, pod in _pod_specs(docs)
        for container in _containers(pod)
        for env in container.get("env", [])
    }
    assert {name for name in used if name.startswith("TORCHPORT_")} - known_variables() == set()


# ------------------------------------------------------------------ workers and GPUs


def _workers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: d
        for name, d in _by_kind(docs, "Deployment").items()
        if d["spec"]["template"]["metadata"]["labels"].get("torchport.io/role") == "worker"
    }


def _queue(deployment: dict[str, Any]) -> str:
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    return str(command[command.index("--queues") + 1])


@pytest.mark.parametrize("target", TARGETS)
def test_worker_pods_run_under_gvisor(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    workers = _workers(docs)
    assert set(workers) == {"torchport-worker-cpu", "torchport-worker-gpu"}
    runtime = _by_kind(docs, "RuntimeClass")["gvisor"]
    assert runtime["handler"] == "runsc"
    for worker in workers.values():
        assert worker["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"


@pytest.mark.parametrize("target", TARGETS)
def test_gvisor_worker_pods_run_one_job_at_a_time(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    # gVisor has no Landlock and the pod's jobs share its non-root uid: two jobs in one
    # pod could read each other's staging directories (docs/sandbox.md).
    for worker in _workers(rendered[target]).values():
        pod = worker["spec"]["template"]["spec"]
        assert pod["runtimeClassName"] == "gvisor"
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        command = container["command"]
        assert command[command.index("--concurrency") + 1] == "1"


@pytest.mark.parametrize("target", TARGETS)
def test_gpu_worker_requests_one_gpu_on_gpu_nodes_with_concurrency_one(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    gpu = _workers(rendered[target])["torchport-worker-gpu"]
    pod = gpu["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert _queue(gpu) == "gpu"
    command = container["command"]
    assert command[command.index("--concurrency") + 1] == "1"
    assert container["image"].endswith("cuda")
    cpu = _workers(rendered[target])["torchport-worker-cpu"]
    cpu_container = cpu["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in cpu_container["resources"]["limits"]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in cpu_container["env"]
    assert _queue(cpu) == "cpu"


@pytest.mark.parametrize("target", TARGETS)
def test_workers_scale_on_their_own_redis_queue(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    scaled = {
        s["spec"]["scaleTargetRef"]["name"]: s for s in _by_kind(docs, "ScaledObject").values()
    }
    auths = _by_kind(docs, "TriggerAuthentication")
    workers = _workers(docs)
    assert set(scaled) == set(workers)
    for name, worker in workers.items():
        (trigger,) = scaled[name]["spec"]["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == _queue(worker)
        assert int(trigger["metadata"]["listLength"]) >= 1
        auth = auths[trigger["authenticationRef"]["name"]]
        assert auth["spec"]["secretTargetRef"][0]["name"] == "torchport-secrets"
    assert scaled["torchport-worker-gpu"]["spec"]["minReplicaCount"] == 0


@pytest.mark.parametrize("target", TARGETS)
def test_every_deployment_has_a_disruption_budget(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    budgets = list(_by_kind(docs, "PodDisruptionBudget").values())
    for name, deployment in _by_kind(docs, "Deployment").items():
        if deployment["metadata"]["labels"].get("app.kubernetes.io/name") != "torchport":
            continue
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert [
            b for b in budgets if _labels_match(b["spec"]["selector"]["matchLabels"], labels)
        ], name


@pytest.mark.parametrize("target", TARGETS)
def test_api_autoscales_and_is_scraped_by_prometheus(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    api = _by_kind(docs, "Deployment")["torchport-api"]
    annotations = api["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    container = api["spec"]["template"]["spec"]["containers"][0]
    assert int(annotations["prometheus.io/port"]) == container["ports"][0]["containerPort"]
    hpa = _by_kind(docs, "HorizontalPodAutoscaler")["torchport-api"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "torchport-api",
    }
    assert hpa["spec"]["minReplicas"] >= 1
    service = _by_kind(docs, "Service")["torchport-api"]
    assert _labels_match(service["spec"]["selector"], api["spec"]["template"]["metadata"]["labels"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


# ------------------------------------------------------------------ network policies


def _policies_for(docs: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        p
        for p in _by_kind(docs, "NetworkPolicy").values()
        if _labels_match(p["spec"]["podSelector"].get("matchLabels", {}), labels)
    ]


@pytest.mark.parametrize("target", TARGETS)
def test_namespace_denies_all_traffic_by_default(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    deny = _by_kind(rendered[target], "NetworkPolicy")["torchport-default-deny"]
    assert deny["spec"]["podSelector"] == {}
    assert set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]


@pytest.mark.parametrize("target", TARGETS)
def test_workers_reach_only_redis_postgres_the_store_and_dns(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    allowed_ports = {6379, 5432, 9000, 443, 53}
    for name, worker in _workers(docs).items():
        labels = worker["spec"]["template"]["metadata"]["labels"]
        policies = _policies_for(docs, labels)
        assert len(policies) >= 2, name  # the default deny and the workers' own
        ports: set[int] = set()
        for policy in policies:
            assert "Egress" in policy["spec"]["policyTypes"]
            assert policy["spec"].get("ingress", []) == [], name
            for rule in policy["spec"].get("egress", []):
                assert rule.get("to"), f"{name}: an egress rule open to every destination"
                assert rule.get("ports"), f"{name}: an egress rule open on every port"
                for peer in rule["to"]:
                    cidr = peer.get("ipBlock", {}).get("cidr")
                    assert cidr not in {"0.0.0.0/0", "::/0"}, name
                ports |= {p["port"] for p in rule["ports"]}
        assert ports <= allowed_ports, name
        assert {6379, 5432, 53} <= ports, name
        assert ports & {9000, 443}, name


@pytest.mark.parametrize("target", TARGETS)
def test_webhooks_worker_reaches_public_addresses_only(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    hooks = _by_kind(docs, "Deployment")["torchport-webhooks"]
    assert _queue(hooks) == "webhooks"
    labels = hooks["spec"]["template"]["metadata"]["labels"]
    assert labels["torchport.io/role"] == "webhooks"  # not a worker: it runs no upload
    internal = {"10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"}
    for policy in _policies_for(docs, labels):
        assert policy["spec"].get("ingress", []) == []
        for rule in policy["spec"].get("egress", []):
            assert rule.get("to")
            for peer in rule["to"]:
                block = peer.get("ipBlock", {})
                if block.get("cidr") == "0.0.0.0/0":
                    assert internal <= set(block["except"])
                if block.get("cidr") == "::/0":
                    assert {"::1/128", "fc00::/7", "fe80::/10"} <= set(block["except"])
    for worker in _workers(docs).values():
        assert _queue(worker) != "webhooks"


@pytest.mark.parametrize("target", TARGETS)
def test_api_accepts_traffic_only_on_its_port(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    api = _by_kind(docs, "Deployment")["torchport-api"]
    policies = _policies_for(docs, api["spec"]["template"]["metadata"]["labels"])
    ingress_ports = {
        p["port"]
        for policy in policies
        for rule in policy["spec"].get("ingress", [])
        for p in rule["ports"]
    }
    assert ingress_ports == {8000}


def test_prod_egress_goes_to_address_ranges_not_in_cluster_pods(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["overlays/prod"]
    workers = _by_kind(docs, "NetworkPolicy")["torchport-workers"]
    peers = [peer for rule in workers["spec"]["egress"] for peer in rule["to"]]
    data_peers = [p for p in peers if "namespaceSelector" not in p]
    assert data_peers and all("ipBlock" in p for p in data_peers)
    assert not [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "redis"]


def test_dev_runs_its_own_backing_services(rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployments = _by_kind(rendered["overlays/dev"], "Deployment")
    assert {"redis", "postgresql", "minio"} <= set(deployments)
    config = _by_kind(rendered["overlays/dev"], "ConfigMap")["torchport-config"]
    assert config["data"]["TORCHPORT_S3_ENDPOINT_URL"] == "http://minio:9000"
