"""Greedy decoding with eager transformers and with a cached program, and their comparison.

Every loop generates `max_new_tokens` (no stop at an end-of-sequence token); an
artifact's run given eager's tokens stops at its first token that differs from them (the
tokens after it would follow another prefix, and are never compared).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from schemas import GenerationCheck

__all__ = ["Step", "cached_tokens", "check", "eager_tokens", "first_difference", "parted"]

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""One call of a static-cache program: (input_ids, cache_position) → logits."""


def _next(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, :].argmax(dim=-1, keepdim=True)


@torch.no_grad()
def eager_tokens(model: torch.nn.Module, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Greedy tokens of the transformers model itself, with its default dynamic cache."""
    out = model(input_ids=prompt, use_cache=True)
    token = _next(out.logits)
    tokens = [int(token)]
    for _ in range(max_new_tokens - 1):
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        token = _next(out.logits)
        tokens.append(int(token))
    return tokens


def parted(tokens: list[int], expected: list[int] | None) -> bool:
    """Whether the last of `tokens` differs from eager's token there (`expected`)."""
    return expected is not None and tokens[-1] != expected[len(tokens) - 1]


@torch.no_grad()
def cached_tokens(
    step: Step, prompt: torch.Tensor, max_new_tokens: int, expected: list[int] | None = None
) -> list[int]:
    """Greedy tokens of a static-cache program: the prompt in one prefill at positions
    0…n-1, then one token per call at the next position; with `expected` (eager's), up to
    the first that differs."""
    length = prompt.shape[1]
    token = _next(step(prompt, torch.arange(length)))
    tokens = [int(token)]
    for position in range(length, length + max_new_tokens - 1):
        if parted(tokens, expected):
            break
        token = _next(step(token, torch.tensor([position])))
        tokens.append(int(token))
    return tokens


def first_difference(expected: list[int], generated: list[int]) -> int | None:
    """The index of the first token where the lists differ (a missing token counts);
    None when they are equal."""
    mismatch = next(
        (i for i, (a, b) in enumerate(zip(expected, generated, strict=False)) if a != b), None
    )
    if mismatch is None and len(generated) != len(expected):
        mismatch = min(len(generated), len(expected))
    return mismatch


def check(
    expected: list[int], generate: Callable[[], list[int]], prompt_tokens: int
) -> GenerationCheck:
    """Run `generate` and compare its tokens with `expected`."""
    started = time.perf_counter()
    generated = generate()
    mismatch = first_difference(expected, generated)
    return GenerationCheck(
        max_new_tokens=len(expected),
        prompt_tokens=prompt_tokens,
        matched=mismatch is None,
        first_mismatch=mismatch,
        expected=expected,
        generated=generated,
        duration_s=time.perf_counter() - started,
    )
