"""A deployment target made only of this module and one registry row (the registry test
adds the row): `model.copy.pt2`, the program saved again by `torch.export.save` and run
by `torch.export.load`. Shows what a target implements (`engine.targets.interface`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.targets.interface import Conversion, TargetJob
from schemas import ExportOptions, VerifyOptions

THREAD_SETTINGS: tuple[str, ...] = ()


def runtime() -> str:
    return f"torch {torch.__version__} (torch.export.load)"


def prepare(job: TargetJob) -> Conversion:
    return Conversion(job.program, job.args, job.kwargs, dict(job.overrides))


def convert(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    facts: dict[str, Any] | None = None,
) -> Path:
    torch.export.save(program, path)
    if facts is not None:
        facts["nodes"] = len(program.graph.nodes)
    return path


def loading(settings: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    return {}


def load(path: Path, program: torch.export.ExportedProgram, threads: int | None = None) -> Any:
    module = torch.export.load(path).module()

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        return list(torch.utils._pytree.tree_leaves(module(*args, **kwargs)))

    return run


def tolerances(options: ExportOptions) -> VerifyOptions:
    return options.verify


def convert_encoder(
    encoder: Any, path: Path, settings: dict[str, Any], facts: dict[str, Any]
) -> tuple[Any, list[Path]]:
    raise NotImplementedError("no encoder-decoder models")


def notes(facts: dict[str, Any]) -> list[str]:
    return [f"{facts.get('nodes')} nodes"]
