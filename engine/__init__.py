"""The torchport export engine: load → trace → decompose → verify → serialize.

A pure library: it imports torch and `schemas`, never web, queue or database code,
and never reads the environment. One sub-package per stage (`load`, `trace`,
`decompose`, `verify`, `serialize`), the deployment `targets`, and what they share
(`shapes`, `diagnostics`, `environment`, `profile`, `generation`, `quantization`);
`pipeline` runs them in order.

The names below are the engine's public face, imported on first use (as
`torch.export` and `pydantic` keep theirs cheap): `import engine` imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import face

if TYPE_CHECKING:
    from engine.environment.libraries import describe_environment
    from engine.errors import ExportError
    from engine.load.model import Upload
    from engine.pipeline.export import run_export, warm_up
    from engine.pipeline.request import ExportRequest, ExportResult

__all__ = [
    "ExportError",
    "ExportRequest",
    "ExportResult",
    "Upload",
    "describe_environment",
    "run_export",
    "warm_up",
]

_WHERE = {
    "ExportError": "engine.errors",
    "ExportRequest": "engine.pipeline.request",
    "ExportResult": "engine.pipeline.request",
    "Upload": "engine.load.model",
    "describe_environment": "engine.environment.libraries",
    "run_export": "engine.pipeline.export",
    "warm_up": "engine.pipeline.export",
}


__getattr__, __dir__ = face(__name__, _WHERE, globals())
