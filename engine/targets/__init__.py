"""Deployment targets: the exported program converted for the runtimes people deploy with,
each artifact run back in its own runtime and compared with eager PyTorch.

- `onnx` (`engine.targets.onnx`): `model.onnx` from `torch.onnx.export(ep, dynamo=True)`,
  run by ONNX Runtime (CPU provider);
- `aoti` (`engine.targets.aoti`): `model.aoti.pt2` from
  `torch._inductor.aoti_compile_and_package`, run by `torch._inductor.aoti_load_package`;
- `executorch` (`engine.targets.executorch`): `model.pte` from
  `to_edge_transform_and_lower` with the XNNPACK partitioner, run by the ExecuTorch runtime.

A target is a module implementing `interface.Target` (prepare, convert, load, …; its
third-party packages imported only inside those functions) plus one row of `registry`
(its files, packages, hints, quantization schemes, toolchain programs). `run.run_target`
drives every target the same way from one `interface.TargetJob`.

This face is torch-free and cheap: `ORDER`, `TARGETS`, `TargetSpec` and `spec` come from
the registry; the rest is imported on first use, as `torch.export` keeps its own face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import face
from engine.targets.registry import ORDER, TARGETS, TargetSpec, spec

if TYPE_CHECKING:
    from engine.environment.target_requirements import missing
    from engine.targets.failures import TargetError, clean
    from engine.targets.interface import (
        Conversion,
        FlatRunner,
        Target,
        TargetJob,
        structured_runner,
    )
    from engine.targets.run import module, run_target, skipped

__all__ = [
    "ORDER",
    "TARGETS",
    "Conversion",
    "FlatRunner",
    "Target",
    "TargetError",
    "TargetJob",
    "TargetSpec",
    "clean",
    "missing",
    "module",
    "run_target",
    "skipped",
    "spec",
    "structured_runner",
]

_LAZY = {
    "missing": "engine.environment.target_requirements",
    "TargetError": "engine.targets.failures",
    "clean": "engine.targets.failures",
    "Conversion": "engine.targets.interface",
    "FlatRunner": "engine.targets.interface",
    "Target": "engine.targets.interface",
    "TargetJob": "engine.targets.interface",
    "module": "engine.targets.run",
    "run_target": "engine.targets.run",
    "skipped": "engine.targets.run",
    "structured_runner": "engine.targets.interface",
}


__getattr__, __dir__ = face(__name__, _LAZY, globals())
