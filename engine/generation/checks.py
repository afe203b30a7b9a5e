"""The generation checks of a job: the program's (`ep.module()`) and each target's."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.errors import VerificationFailed
from engine.generation.greedy import Step, cached_tokens, check, eager_tokens
from engine.generation.ready import Generation
from schemas import GenerationCheck, GenerationReport

__all__ = ["checked", "expected_tokens", "mismatch_error", "program_report", "runner_check"]

INPUTS = ["input_ids", "cache_position"]


def expected_tokens(generation: Generation) -> list[int]:
    """Eager transformers' greedy tokens from the example prompt (computed once)."""
    if generation.expected is None:
        generation.expected = eager_tokens(
            generation.model, generation.prompt, generation.max_new_tokens
        )
    return generation.expected


def program_report(
    ep: torch.export.ExportedProgram, generation: Generation, *, verify: bool
) -> GenerationReport:
    """The cache's facts and, when `verify`, the program's greedy generation checked.

    The program runs on a copy of its module: `ep.module()` shares the cache buffers
    with `ep`, and the saved program must keep its empty cache.
    """
    result: GenerationCheck | None = None
    if verify:
        module = copy.deepcopy(ep.module())

        def step(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = module(input_ids=ids, cache_position=positions)
            return out

        result = _cached_check(step, generation)
    return GenerationReport(max_cache_len=generation.max_cache_len, inputs=INPUTS, check=result)


def runner_check(
    flat: Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]], generation: Generation
) -> GenerationCheck:
    """A static-cache artifact's greedy generation, run through its runtime's runner
    (`engine.targets.FlatRunner`: its last output is the logits). The runtime keeps the
    cache between calls; positions beyond the current one are masked, so what earlier
    runs left in it does not matter."""

    def step(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        outputs = flat((), {"input_ids": ids, "cache_position": positions})
        logits: torch.Tensor = outputs[-1]
        return logits

    return _cached_check(step, generation)


def checked(generation: Generation, generate: Callable[[], list[int]]) -> GenerationCheck:
    """`generate`'s tokens against eager transformers' for the example prompt."""
    return check(expected_tokens(generation), generate, generation.prompt.shape[1])


def _cached_check(step: Step, generation: Generation) -> GenerationCheck:
    return checked(
        generation, lambda: cached_tokens(step, generation.prompt, generation.max_new_tokens)
    )


def mismatch_error(result: GenerationCheck) -> VerificationFailed:
    """`verification_failed` for a program whose generation differs from eager."""
    index = result.first_mismatch
    expected = (
        result.expected[index] if index is not None and index < len(result.expected) else None
    )
    got = result.generated[index] if index is not None and index < len(result.generated) else None
    return VerificationFailed(
        f"The exported program's greedy generation differs from eager transformers at "
        f"generated token {index} (expected {expected}, got {got}).",
        hint="The KV cache did not export faithfully; report the model type. Set "
        "generation.cache to false to export the plain forward instead.",
        details={
            "reason": "generation_mismatch",
            "first_mismatch": index,
            "expected": expected,
            "got": got,
        },
    )
