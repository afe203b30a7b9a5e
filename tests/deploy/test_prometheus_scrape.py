"""deploy/prometheus/scrape-configs.yml: the shipped scrape jobs present the metrics token
the API's `/metrics` needs, from a file, and find the API where the manifests put it; the
Kubernetes API and compose's `api` service are given that token."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.settings_names import known_variables

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = ROOT / "deploy" / "prometheus" / "scrape-configs.yml"
API = ROOT / "deploy" / "kubernetes" / "base" / "api.yaml"
COMPOSE = ROOT / "docker-compose.yml"


def _jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(SCRAPE.read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def _api_deployment() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(API.read_text()) if d]
    return next(d for d in docs if d["kind"] == "Deployment")


def test_every_job_presents_the_token_from_a_file() -> None:
    jobs = _jobs()
    assert set(jobs) == {"torchport-api", "torchport-api-compose"}
    for name, job in jobs.items():
        assert job["metrics_path"] == "/metrics", name
        auth = job["authorization"]
        assert auth["type"] == "Bearer", name
        assert auth["credentials_file"].startswith("/etc/prometheus/"), name
        assert "credentials" not in auth, name  # never the token itself


def test_the_kubernetes_job_keeps_the_api_pods_on_their_port() -> None:
    job = _jobs()["torchport-api"]
    api = _api_deployment()
    template = api["spec"]["template"]
    labels = template["metadata"]["labels"]
    container = template["spec"]["containers"][0]
    port = container["ports"][0]["containerPort"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    keeps = [rule for rule in job["relabel_configs"] if rule.get("action") == "keep"]
    by_labels = next(r for r in keeps if "pod_label" in r["source_labels"][0])
    # Prometheus names a pod label `__meta_kubernetes_pod_label_<name, each other character _>`.
    sanitized = {re.sub(r"[^a-zA-Z0-9_]", "_", key): value for key, value in labels.items()}
    wanted = [
        sanitized[name.removeprefix("__meta_kubernetes_pod_label_")]
        for name in by_labels["source_labels"]
    ]
    assert by_labels["regex"] == ";".join(wanted)
    by_port = next(
        r for r in keeps if r["source_labels"] == ["__meta_kubernetes_pod_container_port_number"]
    )
    assert by_port["regex"] == str(port)
    assert set(job["kubernetes_sd_configs"][0]["namespaces"]["names"]) == {
        "torchport",
        "torchport-dev",
    }


def test_the_api_is_given_the_token_it_checks() -> None:
    assert "TORCHPORT_METRICS_TOKEN" in known_variables()
    env = {
        e["name"]: e for e in _api_deployment()["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    ref = env["TORCHPORT_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "torchport-secrets", "key": "metrics-token"}
    compose = yaml.safe_load(COMPOSE.read_text())
    api_env = compose["services"]["api"]["environment"]
    assert api_env["TORCHPORT_METRICS_TOKEN"] == "${TORCHPORT_METRICS_TOKEN:-}"
