"""Settings of library models switched before tracing, so that they export portably.

transformers 5 runs the experts of a mixture-of-experts layer (Mixtral, Qwen3-MoE,
DeepSeek-V3, …) through `transformers.integrations.moe`, chosen at forward time by
`config._experts_implementation`. Its default, `grouped_mm`, traces on CPU float32 to
`transformers::grouped_mm_fallback`, a custom operator transformers registers at import,
so the program does not load where only torch is imported; `eager` loops over the
experts that received tokens and fails data-dependent. `batched_mm` gathers each token's
expert weights and multiplies them with `bmm`: ATen only, static shapes, the same
numbers. The switch is made on the module that is traced; the copy that verification
compares against keeps the user's setting. Each switch is a `library_adapted` warning.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from schemas import ReportWarning

__all__ = ["EXPORTABLE_EXPERTS", "REPLACED_EXPERTS", "adapt_for_export"]

EXPORTABLE_EXPERTS = "batched_mm"
"""The experts implementation traced instead."""

REPLACED_EXPERTS = frozenset({None, "eager", "grouped_mm", "deepgemm", "sonicmoe"})
"""transformers' own implementations that do not export portably (None: the default,
`grouped_mm`). Names a user registered in `ALL_EXPERTS_FUNCTIONS` are left alone."""


def _has_dispatched_experts(model: torch.nn.Module) -> bool:
    """Whether a module of `model` is an experts class decorated with transformers'
    `use_experts_implementation` (its forward dispatches on the config)."""
    for module in model.modules():
        code = getattr(type(module).forward, "__code__", None)
        if code is not None and "use_experts_implementation" in code.co_qualname:
            return True
    return False


def _experts_settings(model: Any) -> dict[str, str | None]:
    return dict(model.get_experts_implementation())


def adapt_for_export(module: torch.nn.Module) -> list[ReportWarning]:
    """Switch the transformers models inside `module` whose experts would trace to a
    custom operator (or fail) to `batched_mm`; one warning per model switched.

    Does nothing unless the upload imported transformers.
    """
    modeling = sys.modules.get("transformers.modeling_utils")
    pretrained = getattr(modeling, "PreTrainedModel", None)
    if pretrained is None:
        return []
    warnings: list[ReportWarning] = []
    inner: set[int] = set()
    for path, model in module.named_modules():
        if not isinstance(model, pretrained) or id(model) in inner:
            continue
        inner |= {id(sub) for sub in model.modules()}  # set_experts_… reaches submodels
        if not _has_dispatched_experts(model):
            continue
        before = _experts_settings(model)
        if not set(before.values()) & REPLACED_EXPERTS:
            continue
        try:
            model.set_experts_implementation(EXPORTABLE_EXPERTS)
        except (RuntimeError, ValueError, KeyError):
            continue  # a load-time choice; a custom op left in is named before saving
        after = _experts_settings(model)
        if after == before:
            continue
        warnings.append(
            ReportWarning(
                code="library_adapted",
                message=f"{type(model).__name__}'s experts were traced with transformers' "
                f"experts implementation {EXPORTABLE_EXPERTS!r} instead of "
                f"{before.get('')!r}, which traces to a custom operator a torch-only loader "
                "lacks (or fails data-dependent); verification compares against the model "
                "as given.",
                details={
                    "library": "transformers",
                    "module": path,
                    "type": type(model).__name__,
                    "setting": "experts_implementation",
                    "before": before,
                    "after": after,
                },
            )
        )
    return warnings
