"""docker-compose.yml and the Dockerfile, checked with a real compose parser (no Docker engine).

Debian's `docker-compose` (1.29) parses, interpolates and prints the configuration offline.
"""

from __future__ import annotations

import importlib
import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.settings_names import known_variables

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SECRETS = {
    "POSTGRES_PASSWORD": "pg-3f9a1c",
    "REDIS_PASSWORD": "redis-77d0e2",
    "S3_ACCESS_KEY": "access-5b1e",
    "S3_SECRET_KEY": "secret-c4a9d8",
    "MINIO_ROOT_USER": "root-user-1",
    "MINIO_ROOT_PASSWORD": "root-pass-2e8f",
    "TORCHPORT_WEBHOOK_SECRET": "w" * 40,
}
EXPECTED_SERVICES = {
    "redis",
    "postgres",
    "minio",
    "minio-init",
    "migrate",
    "api",
    "worker-cpu",
    "worker-webhooks",
    "worker-gpu",
}
TORCHPORT_SERVICES = ("migrate", "api", "worker-cpu", "worker-webhooks", "worker-gpu")


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (Debian package `docker-compose`)"
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    out = _compose("--profile", "gpu", "config", env=SECRETS)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(missing: str) -> None:
    env = {k: v for k, v in SECRETS.items() if k != missing}
    out = _compose("config", "-q", env=env)
    assert out.returncode != 0
    assert missing in out.stderr


def test_compose_has_the_expected_services(config: dict[str, Any]) -> None:
    assert set(config["services"]) == EXPECTED_SERVICES


def test_gpu_worker_is_under_the_gpu_profile_with_a_device_reservation(
    config: dict[str, Any],
) -> None:
    gpu = config["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert len(device["device_ids"]) == 1
    assert gpu["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert gpu["build"]["args"]["DEVICE"] == "cuda"
    assert gpu["command"] == ["torchport", "worker", "--queues", "gpu", "--concurrency", "1"]
    # Services without a profile are not started by `--profile gpu` alone.
    assert all("profiles" not in s for n, s in config["services"].items() if n != "worker-gpu")


def test_cpu_worker_sees_no_gpu_and_consumes_the_cpu_queue(config: dict[str, Any]) -> None:
    cpu = config["services"]["worker-cpu"]
    assert cpu["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["command"][:4] == ["torchport", "worker", "--queues", "cpu"]
    assert "deploy" not in cpu


def test_webhooks_have_their_own_worker(config: dict[str, Any]) -> None:
    hooks = config["services"]["worker-webhooks"]
    assert hooks["command"] == ["torchport", "worker", "--queues", "webhooks"]
    assert "TORCHPORT_WEBHOOK_ALLOW_HOSTS" in hooks["environment"]
    for name in ("worker-cpu", "worker-gpu"):
        assert "webhooks" not in config["services"][name]["command"]


def test_migrations_run_before_the_api_and_workers(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker-cpu", "worker-gpu"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["redis"]["condition"] == "service_healthy"
    assert services["api"]["environment"]["TORCHPORT_AUTO_MIGRATE"] == "false"


def test_torchport_services_reach_postgres_redis_and_minio_with_the_given_secrets(
    config: dict[str, Any],
) -> None:
    for name in TORCHPORT_SERVICES:
        env = config["services"][name]["environment"]
        assert env["TORCHPORT_DATABASE_URL"] == (
            "postgresql+psycopg://torchport:pg-3f9a1c@postgres:5432/torchport"
        )
        assert env["TORCHPORT_BROKER_URL"] == "redis://:redis-77d0e2@redis:6379/0"
        assert env["TORCHPORT_STORE_URL"].startswith("s3://")
        assert env["TORCHPORT_S3_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_ACCESS_KEY_ID"] == SECRETS["S3_ACCESS_KEY"]
        assert env["AWS_SECRET_ACCESS_KEY"] == SECRETS["S3_SECRET_KEY"]
    assert (
        config["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"]
        == SECRETS["POSTGRES_PASSWORD"]
    )


def test_every_torchport_variable_is_read_by_a_settings_class(config: dict[str, Any]) -> None:
    known = known_variables()
    used = {
        name
        for service in TORCHPORT_SERVICES
        for name in config["services"][service]["environment"]
        if name.startswith("TORCHPORT_")
    }
    assert used - known == set()


def test_api_command_healthcheck_and_port(config: dict[str, Any]) -> None:
    api = config["services"]["api"]
    assert api["command"][:3] == ["uvicorn", "service.app:create_app", "--factory"]
    assert api["command"][api["command"].index("--port") + 1] == "8000"
    assert api["healthcheck"]["test"] == ["CMD", "python", "/usr/local/bin/torchport-healthcheck"]
    assert api["ports"][0]["target"] == 8000


def test_torchport_containers_are_hardened(config: dict[str, Any]) -> None:
    for name in TORCHPORT_SERVICES:
        service = config["services"][name]
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in service["security_opt"]


def test_data_lives_in_named_volumes(config: dict[str, Any]) -> None:
    services = config["services"]
    mounts = {
        name: {v.split(":")[1] if isinstance(v, str) else v["target"] for v in s.get("volumes", [])}
        for name, s in services.items()
    }
    assert "/var/lib/postgresql/data" in mounts["postgres"]
    assert "/data" in mounts["redis"]
    assert "/data" in mounts["minio"]
    assert {"postgres-data", "redis-data", "minio-data"} <= set(config["volumes"])


def test_compose_file_inlines_no_secret_values() -> None:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    secretish = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|_KEY$")

    def walk(node: Any) -> list[str]:
        found: list[str] = []
        if isinstance(node, dict):
            for key, value in node.items():
                interpolated = isinstance(value, str) and re.fullmatch(
                    r"\$\{[A-Z0-9_]+:\?[^}]+\}", value
                )
                if isinstance(key, str) and secretish.search(key) and not interpolated:
                    found.append(f"{key}={value}")
                found.extend(walk(value))
        elif isinstance(node, list):
            for item in node:
                found.extend(walk(item))
        return found

    assert walk(raw) == []


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        (line.split()[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_dockerfile_is_multistage_non_root_with_healthcheck_and_device_argument() -> None:
    instructions = _dockerfile_instructions()
    stages = [arg for op, arg in instructions if op == "FROM"]
    assert len(stages) >= 2
    assert stages[-1].split()[-1] == "runtime"
    users = [arg for op, arg in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    assert any(op == "HEALTHCHECK" for op, _ in instructions)
    assert any(op == "ARG" and arg.startswith("DEVICE=cpu") for op, arg in instructions)
    copied_from_build = [arg for op, arg in instructions if op == "COPY" and "--from=build" in arg]
    assert any("/opt/venv" in arg for arg in copied_from_build)


def test_dockerignore_keeps_the_build_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert next(line for line in lines if not line.startswith("#")) == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert {
        "schemas",
        "engine",
        "persistence",
        "service",
        "worker",
        "torchport",
        "pyproject.toml",
    } <= (allowed)
    assert not allowed & {".venv", "tests", ".git"}


def test_healthcheck_reports_an_unreachable_api() -> None:
    module = runpy.run_path(str(ROOT / "deploy" / "healthcheck.py"))
    assert module["check_api"]("http://127.0.0.1:9/healthz", timeout_s=1.0) is False
    assert module["main"](["healthcheck", "api"]) == 1  # nothing listens on 8000 here


def test_worker_healthcheck_counts_only_this_hosts_nodes() -> None:
    module = runpy.run_path(str(ROOT / "deploy" / "healthcheck.py"))
    replies = [
        {"torchport-7@pod-a": {"ok": "pong"}},
        {"torchport-9@pod-b": {"ok": "pong"}},
        {"torchport-8@pod-a": {"ok": "pong"}},
    ]
    assert module["local_nodes"](replies, "pod-a") == ["torchport-7@pod-a", "torchport-8@pod-a"]
    assert module["local_nodes"](replies, "pod-c") == []


def test_commands_exist_in_the_code_they_name(config: dict[str, Any]) -> None:
    from torchport.cli import build_parser

    for name in ("worker-cpu", "worker-webhooks", "worker-gpu"):
        command = config["services"][name]["command"]
        assert command[0] == "torchport"
        args = build_parser(command[1:]).parse_args(command[1:])
        assert args.command == "worker"
        assert args.queues in {"cpu", "gpu", "webhooks"}
        assert args.concurrency >= 1
        assert config["services"][name]["healthcheck"]["test"][-1] == "worker"
    app_module = importlib.import_module("service.app")
    assert callable(app_module.create_app)
    database = importlib.import_module("persistence.database")
    assert callable(database.migrate)
