"""Dependencies point one way, arrows only downward:

torchport (CLI) → service (HTTP) → persistence → schemas
torchport (CLI) → worker → persistence, engine, schemas
engine → schemas (and torch); schemas → nothing of ours
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"engine", "schemas", "persistence", "service", "worker", "torchport"}


def _modules_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


@pytest.mark.parametrize("module", ["engine.pipeline.export", "engine.serialize.roundtrip"])
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
    loaded = _modules_after_import("engine.serialize.roundtrip")
    assert not loaded & {"pydantic", "schemas", "persistence", "service", "worker", "rich"}


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
        "engine.serialize.artifacts",
        "engine.environment.libraries",
        "worker.sandbox.host.runner",
        "worker.environment",
        "torchport.commands.export",
        "torchport.commands.env",
    ],
)
def test_the_worker_side_never_imports_torch(module: str) -> None:
    # The worker process holds secrets and never imports torch; uploads run in the zygote.
    assert "torch" not in _modules_after_import(module)


def _imports(package: str) -> list[tuple[str, str]]:
    """(file, imported module) for every absolute import in a package's sources."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.relative_to(ROOT).as_posix(), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path.relative_to(ROOT).as_posix(), node.module))
    return found


FORBIDDEN = {
    # package: top-level modules it must never import (of ours, and the web stack)
    "engine": {"persistence", "service", "worker", "torchport", "fastapi", "starlette"},
    "persistence": {"service", "worker", "torchport", "engine", "fastapi", "starlette"},
    "worker": {"service", "torchport", "fastapi", "starlette", "uvicorn", "httpx_sse"},
    "service": {"worker", "torchport", "engine", "torch"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_arrows_point_only_downward(package: str) -> None:
    offenders = [
        f"{file}: {module}"
        for file, module in _imports(package)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert offenders == []


def test_nothing_below_the_cli_imports_the_cli() -> None:
    offenders = [
        f"{file}: {module}"
        for package in ("schemas", "engine", "persistence", "service", "worker")
        for file, module in _imports(package)
        if module.split(".")[0] == "torchport"
    ]
    assert offenders == []


def test_the_worker_never_loads_the_web_stack() -> None:
    loaded = _modules_after_import("worker.tasks")
    assert not loaded & {"service", "fastapi", "starlette", "uvicorn"}


def test_persistence_loads_no_web_code_and_no_torch() -> None:
    code = (
        "import importlib, pkgutil, sys, persistence\n"
        "for m in pkgutil.iter_modules(persistence.__path__):\n"
        "    importlib.import_module('persistence.' + m.name)\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & "
        "{'torch', 'engine', 'service', 'worker', 'fastapi', 'starlette'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


MAX_MODULE_LINES = 500
"""Rooms of a few hundred lines: a module past this is split by what it does."""


def test_no_module_of_ours_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for package in sorted(OURS)
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 100  # the packages were found
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def _python_imports(package: Path) -> dict[str, set[str]]:
    """Each module of `package` (one folder) → the modules of the same folder it imports,
    wherever the import statement stands (a function's lazy import is an arrow too)."""
    modules = {p.stem: p for p in package.glob("*.py") if p.name != "__init__.py"}
    dotted = package.relative_to(ROOT).as_posix().replace("/", ".")
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                base = node.module or ""
                targets = [base.split(".")[0]] if base else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == dotted:
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(dotted + "."):
                targets = [(node.module or "")[len(dotted) + 1 :].split(".")[0]]
            elif isinstance(node, ast.Import):
                targets = [
                    a.name[len(dotted) + 1 :].split(".")[0]
                    for a in node.names
                    if a.name.startswith(dotted + ".")
                ]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _script_imports(folder: Path) -> dict[str, set[str]]:
    """Each ES module of `folder` → the modules of the same folder it imports."""
    modules = {p.name for p in folder.glob("*.js")}
    pattern = re.compile(r"""(?:from|import)\s*\(?\s*["']\./([\w.]+\.js)["']""")
    return {
        name: {t for t in pattern.findall((folder / name).read_text()) if t in modules} - {name}
        for name in modules
    }


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or not."""
    reach: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - reach:
            reach.add(nxt)
            todo.append(nxt)
    return reach


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: modules that reach each other, each circle sorted."""
    reach = {name: _reachable(graph, name) for name in graph}
    circles = {
        tuple(sorted({name} | {m for m in reach[name] if name in reach[m]}))
        for name in graph
        if name in reach[name]
    }
    return sorted(list(c) for c in circles)


# Circles the restructurings left (issue 21, "keep the house"), all removed since: none may
# come back.
KNOWN_CIRCLES: dict[str, list[list[str]]] = {}


def test_no_import_circles_between_the_modules_of_a_package() -> None:
    packages = sorted(
        p.parent.relative_to(ROOT).as_posix()
        for top in OURS
        for p in (ROOT / top).rglob("__init__.py")
        if "migrations" not in p.parts
    )
    assert "engine" in packages and "worker/sandbox" in packages
    found = {name: _circles(_python_imports(ROOT / name)) for name in packages}
    assert {name: circles for name, circles in found.items() if circles} == KNOWN_CIRCLES


def test_no_import_circles_between_the_web_pages_scripts() -> None:
    graph = _script_imports(ROOT / "service" / "web" / "static")
    assert {"job.js", "result.js", "failure.js", "again.js"} <= set(graph)
    assert "again.js" in graph["job.js"] and "result.js" in graph["failure.js"]
    assert _circles(graph) == []


def test_the_engines_public_face_is_lazy_and_complete() -> None:
    code = (
        "import json, sys, engine; before = 'torch' in sys.modules; "
        "found = {n: getattr(engine, n).__module__ for n in engine.__all__}; "
        "print(json.dumps([before, found]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    torch_at_import, found = json.loads(out.stdout.splitlines()[-1])
    assert torch_at_import is False  # `import engine` alone imports no torch
    assert set(found) == {
        "ExportError",
        "ExportRequest",
        "ExportResult",
        "Upload",
        "describe_environment",
        "run_export",
        "warm_up",
    }
    assert all(module.startswith("engine.") for module in found.values())


STAGES = ["load", "trace", "decompose", "verify", "serialize"]
"""The engine's stage packages in the order a job runs them."""
LATER_THAN_STAGES = {"pipeline", "targets"}
"""Packages that run the stages (and the targets after them): no stage imports them."""


def test_engine_stages_import_only_earlier_stages() -> None:
    offenders = []
    for file, module in _imports("engine"):
        parts = file.split("/")
        if len(parts) < 3 or parts[1] not in STAGES or not module.startswith("engine."):
            continue
        stage, imported = parts[1], module.split(".")[1]
        if imported in LATER_THAN_STAGES or (
            imported in STAGES and STAGES.index(imported) > STAGES.index(stage)
        ):
            offenders.append(f"{file}: {module}")
    assert offenders == []


def test_the_sandbox_host_side_imports_neither_the_zygote_side_nor_torch() -> None:
    offenders = [
        f"{file}: {module}"
        for file, module in _imports("worker/sandbox/host")
        if module.split(".")[0] == "torch"
        or module.startswith(("worker.sandbox.zygote", "worker.sandbox.child"))
    ]
    assert offenders == []
    loaded = _full_modules_after_import("worker.sandbox.host.runner")
    assert "torch" not in {name.split(".")[0] for name in loaded}
    assert not [
        n for n in loaded if n.startswith(("worker.sandbox.zygote", "worker.sandbox.child"))
    ]


def _full_modules_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_no_level_holds_more_than_a_dozen_modules() -> None:
    crowded = {
        folder.relative_to(ROOT).as_posix(): count
        for top in ("engine", "worker/sandbox")
        for folder in [ROOT / top, *(ROOT / top).rglob("*/")]
        if folder.is_dir()
        and (folder / "__init__.py").exists()
        and (count := len([p for p in folder.glob("*.py") if p.name != "__init__.py"])) > 13
    }
    assert crowded == {}
