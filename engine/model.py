"""What the stages hand each other: the upload, and the model loaded from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.source_map import SourceMap


@dataclass(frozen=True)
class Upload:
    """Paths of the uploaded files, as the job received them."""

    model: Path
    inputs: Path | None = None
    weights: Path | None = None


@dataclass
class LoadedModel:
    """A user model ready to export.

    `module` is pristine: it was never run. The eager reference run happened on a deep
    copy, whose outputs and buffers after the run are kept here.
    """

    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    source_map: SourceMap
    entry: str
    module_name: str
    module_dynamic_shapes: Any = None
    eager_outputs: Any = None
    eager_buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    device: str = "cpu"
