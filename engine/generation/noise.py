"""Greedy tokens that differ in reduced precision: is the first difference noise?

A bfloat16 program and eager bfloat16 round differently; where eager's two best tokens
are nearly tied, either may win, and the sequences part there without anything being
wrong. So when a run's tokens differ and the model's weights are bfloat16 or float16,
the first mismatch is judged: eager runs the prefix both sides agreed on (the prompt
and the tokens before the mismatch, no cache) once in its dtype and once in float32
(`engine.verify.precision.float32_run`). `noise` is eager's own error there (max abs over
the logits), `margin` its logit of its own token minus its logit of the artifact's; the
mismatch is within the noise when `margin <= PRECISION_RATIO * noise`, the same
allowance verification gives the program's outputs. The tokens after a mismatch follow
other prefixes and are not compared.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.verify.precision import PRECISION_RATIO, float32_run, reduced_model

__all__ = ["judged", "reduced_model"]


@torch.no_grad()
def judged(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    expected: list[int],
    generated: list[int],
    index: int,
) -> dict[str, Any]:
    """`within_noise`, `margin` and `noise` of a decoder-only run whose tokens first
    differ at `index` (eager's `expected`, the artifact's `generated`)."""
    if index >= len(expected) or index >= len(generated):
        return {"within_noise": False}  # a missing token is no rounding
    prefix = torch.cat([prompt, torch.tensor([expected[:index]], dtype=prompt.dtype)], dim=1)
    kwargs = {"input_ids": prefix, "use_cache": False}
    logits = model(**kwargs).logits[0, -1].double()
    reference, _ = float32_run(model, (), kwargs)
    noise = float((logits - reference.logits[0, -1].double()).abs().max())
    margin = float(logits[expected[index]] - logits[generated[index]])
    return {
        "within_noise": margin <= PRECISION_RATIO * noise,
        "margin": margin,
        "noise": noise,
    }
