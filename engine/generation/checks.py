"""The generation checks of a job: the program's (`ep.module()`) and each target's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine import module_copies
from engine.errors import VerificationFailed
from engine.generation.greedy import Step, cached_tokens, check, eager_tokens
from engine.generation.ready import Generation
from engine.generation.seq2seq import DECODER_INPUTS, eager_seq2seq_tokens
from schemas import GenerationCheck, GenerationReport

__all__ = ["checked", "expected_tokens", "mismatch_error", "program_report", "runner_check"]

INPUTS = ["input_ids", "cache_position"]

HiddenStates = Callable[[], torch.Tensor]
"""An encoder program (or artifact) run on the example input: its last hidden state."""


def expected_tokens(generation: Generation) -> list[int]:
    """Eager transformers' greedy tokens from the example prompt (computed once)."""
    if generation.expected is None:
        encoder = generation.encoder
        if encoder is None:
            generation.expected = eager_tokens(
                generation.model, generation.prompt, generation.max_new_tokens
            )
        else:
            start = int(generation.prompt[0, 0])
            generation.expected = eager_seq2seq_tokens(
                generation.model, encoder.kwargs, start, generation.max_new_tokens
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
    encoder = generation.encoder
    if verify:
        module = module_copies.sharing_weights(ep.module())
        if encoder is None:
            step = _step(lambda kwargs: [module(**kwargs)])
        else:
            assert encoder.program is not None, "the encoder program is made first"
            program = encoder.program.module()
            step = _step(lambda kwargs: [module(**kwargs)], lambda: program(**encoder.kwargs))
        result = _cached_check(step, generation)
    return GenerationReport(
        max_cache_len=generation.max_cache_len,
        inputs=INPUTS if encoder is None else DECODER_INPUTS,
        check=result,
    )


def runner_check(
    flat: Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]],
    generation: Generation,
    encoder_flat: Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]] | None = None,
) -> GenerationCheck:
    """A static-cache artifact's greedy generation, run through its runtime's runner
    (`engine.targets.FlatRunner`: its last output is the logits). The runtime keeps the
    cache between calls; positions beyond the current one are masked, so what earlier
    runs left in it does not matter. An encoder-decoder model's decoder artifact is fed
    `encoder_flat`'s output on the example input (the same runtime's encoder)."""
    encoder = generation.encoder
    if encoder is None:
        return _cached_check(_step(lambda kwargs: flat((), kwargs)), generation)
    assert encoder_flat is not None, "an encoder-decoder artifact needs its encoder"

    def hidden() -> torch.Tensor:
        out: torch.Tensor = encoder_flat((), dict(encoder.kwargs))[-1]
        return out

    return _cached_check(_step(lambda kwargs: flat((), kwargs), hidden), generation)


def _step(
    run: Callable[[dict[str, Any]], Sequence[Any]], hidden: HiddenStates | None = None
) -> Step:
    """One call of a static-cache program (its last output is the logits); with
    `hidden`, an encoder-decoder decoder's, fed the encoder's output (computed once)."""
    states: list[torch.Tensor] = []

    def step(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if hidden is None:
            kwargs: dict[str, Any] = {"input_ids": ids, "cache_position": positions}
        else:
            if not states:
                states.append(hidden())
            kwargs = {
                "decoder_input_ids": ids,
                "encoder_hidden_states": states[0],
                "cache_position": positions,
            }
        logits: torch.Tensor = run(kwargs)[-1]
        return logits

    return step


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
