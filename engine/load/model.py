"""What the stages hand each other: the upload, and the model loaded from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.diagnostics.source_map import SourceMap
from engine.generation import Generation
from schemas import CheckpointReport, ReportWarning, WeightsReport


@dataclass(frozen=True)
class Upload:
    """Paths of the uploaded files, as the job received them."""

    model: Path
    inputs: Path | None = None
    weights: Path | None = None
    calibration: Path | None = None
    """Calibration inputs of `quantize.scheme: int8` (engine.quantization.calibration)."""


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
    dynamic_shapes_source: str = "module"
    """`module`: the module's own torch-form spec; `checkpoint`: the JSON spec made for a
    checkpoint's task (engine.load.checkpoint)."""
    eager_outputs: Any = None
    eager_buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    device: str = "cpu"
    weights: WeightsReport | None = None
    """How the uploaded weights file was loaded (report.weights); None without one."""
    warnings: list[ReportWarning] = field(default_factory=list)
    """What loading warns of: a model exported in eval mode, weights skipped."""
    checkpoint: CheckpointReport | None = None
    """For a checkpoint upload: the task and how it was chosen (report.checkpoint)."""
    checkpoint_dir: Path | None = None
    """Where the checkpoint is unpacked (its tokenizer files are copied from there)."""
    generation: Generation | None = None
    """For a generation-ready `text-generation` checkpoint: what the generation check
    needs (`module` is then transformers' static-cache wrapper)."""
    calibration: list[Any] | None = None
    """The `calibration` upload's samples, checked against the example
    (engine.quantization.calibration)."""
    strict: bool | None = None
    """The tracing mode tried first whatever `options.strict` says, the other one after it
    (a generation-ready LLM: non-strict, which never reads the weights' values, so a
    real-size checkpoint's weights stay in the file's pages; strict if that fails)."""
