"""Every deployment path migrates with one command, `torchport db upgrade`.

Compose's `migrate` service, the Kubernetes Job `torchport-migrate`, the Dockerfile's list of
roles and docs/deployment.md all name it, and torchport's own CLI parser accepts it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from torchport.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ["torchport", "db", "upgrade"]
DEPLOYMENT_FILES = (
    ROOT / "Dockerfile",
    ROOT / "docker-compose.yml",
    *sorted((ROOT / "deploy").rglob("*.yaml")),
    ROOT / "docs" / "deployment.md",
)
# The ways of migrating that `torchport db upgrade` replaced.
OTHER_WAYS = re.compile(r"alembic\s+-c|alembic\.ini|from service\.database import migrate")


def _parses(command: list[str]) -> None:
    assert command == COMMAND
    args = build_parser(command[1:]).parse_args(command[1:])
    assert (args.command, args.action) == ("db", "upgrade")
    assert callable(args._run)


def test_compose_migrates_with_torchport_db_upgrade() -> None:
    config: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    migrate = config["services"]["migrate"]
    _parses(migrate["command"])
    assert "TORCHPORT_DATABASE_URL" in migrate["environment"]


def test_the_kubernetes_job_migrates_with_torchport_db_upgrade() -> None:
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "migrate.yaml").read_text())
    assert (job["kind"], job["metadata"]["name"]) == ("Job", "torchport-migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    _parses(container["command"])
    names = {entry["name"] for entry in container["env"]}
    assert "TORCHPORT_DATABASE_URL" in names


def test_the_dockerfile_and_the_docs_name_the_command() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^#\s+migrations:\s+torchport db upgrade\b", dockerfile, re.M)
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    assert "| migrations | `torchport db upgrade`" in deployment


def test_no_deployment_file_migrates_another_way() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in DEPLOYMENT_FILES
        for match in OTHER_WAYS.finditer(path.read_text())
    ]
    assert offenders == []
