"""Dependencies point one way: service → schemas; worker → schemas, engine; engine → torch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"engine", "schemas", "service", "worker", "torchport"}


def _modules_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


@pytest.mark.parametrize("module", ["engine.pipeline", "engine.roundtrip"])
def test_engine_imports_no_web_queue_or_database_code(module: str) -> None:
    loaded = _modules_after_import(module)
    assert "torch" in loaded
    assert not loaded & {
        "fastapi",
        "starlette",
        "celery",
        "kombu",
        "redis",
        "sqlalchemy",
        "uvicorn",
    }


def test_roundtrip_loader_imports_only_torch_and_stdlib() -> None:
    loaded = _modules_after_import("engine.roundtrip")
    assert not loaded & {"pydantic", "schemas", "service", "worker", "rich"}


def _service_modules() -> list[str]:
    return sorted(
        "service." + p.relative_to(ROOT / "service").with_suffix("").as_posix().replace("/", ".")
        for p in (ROOT / "service").rglob("*.py")
        if "migrations" not in p.parts and p.name != "__init__.py"
    )


def test_service_never_imports_torch() -> None:
    modules = _service_modules()
    assert modules, "service/ has no modules"
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('torch' in sys.modules, 'engine' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_schemas_import_nothing_of_ours() -> None:
    offenders = []
    for path in (ROOT / "schemas").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in OURS - {"schemas"}
            ]
    assert offenders == []


@pytest.mark.parametrize(
    "module",
    [
        "engine.artifacts",
        "engine.libraries",
        "worker.sandbox.runner",
        "worker.environment",
        "torchport.commands.export",
        "torchport.commands.env",
    ],
)
def test_the_worker_side_never_imports_torch(module: str) -> None:
    # The worker process holds secrets and never imports torch; uploads run in the zygote.
    assert "torch" not in _modules_after_import(module)
