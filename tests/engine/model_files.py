"""Importing model files of tests/models the way the engine's tests need them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, ExportResult, run_export
from schemas import ExportOptions

MODELS = Path(__file__).resolve().parents[1] / "models"


def import_model_file(name: str) -> ModuleType:
    """Import tests/models/<name>.py once, registered in sys.modules under `name`.

    Once: files that register pytree types or define custom operators cannot run twice.
    Registered: dynamo looks the module of traced code up by name.
    """
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, MODELS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def export_file(
    tmp_path: Path, model: str, options: dict[str, Any] | None = None, **callbacks: Any
) -> ExportResult:
    """Run the whole pipeline on tests/models/<model> with `options`, in `tmp_path`;
    `callbacks` go to run_export (progress, roundtrip_runner, ...)."""
    request = ExportRequest(
        upload=Upload(model=MODELS / model),
        options=ExportOptions.model_validate(options or {}),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    return run_export(request, **callbacks)
