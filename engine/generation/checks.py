"""The generation checks of a job: the program's (`ep.module()`) and each target's.

Each check runs `Generation.prompts()` in order on one loaded program or artifact: the
example prompt, the second prompt and the example again, the last two started again at
position 0 while the cache still holds the run before. Every run's tokens are compared
with eager transformers' (`reference`, computed once per prompt), so a runtime whose
cache keeps state across sequences, or whose decode steps ignore it, fails the check.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from engine.errors import VerificationFailed
from engine.generation import noise
from engine.generation.greedy import Step, cached_tokens, check, eager_tokens, first_difference
from engine.generation.onnx_past import PastProgram, past_tokens
from engine.generation.ready import Generation, Prompt
from engine.generation.seq2seq import DECODER_INPUTS, eager_seq2seq_tokens
from engine.load import module_copies
from schemas import GenerationCheck, GenerationReport, GenerationRun, ReportWarning

__all__ = [
    "CONSTANT_MIN_TOKENS",
    "checked",
    "constant_warnings",
    "expected_tokens",
    "mismatch_details",
    "mismatch_error",
    "mismatch_text",
    "nearly_constant",
    "onnx_check",
    "program_report",
    "reference",
    "runner_check",
]

INPUTS = ["input_ids", "cache_position"]
OUTPUTS = ["logits"]
"""A static-cache program's one output (a decoder's too): the logits, named as the ONNX
model names them."""
CONSTANT_MIN_TOKENS = 4
"""Reference sequences shorter than this are not judged by `nearly_constant`."""

Generate = Callable[[Prompt, list[int]], list[int]]
"""One run of a check: greedy tokens of the artifact from a prompt, started at position 0,
up to the first that differs from eager's (the second argument)."""
FlatRunner = Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]]


def reference(generation: Generation, prompt: Prompt) -> list[int]:
    """Eager transformers' greedy tokens from `prompt` (computed once per prompt)."""
    tokens = generation.references.get(prompt.name)
    if tokens is None:
        count = generation.max_new_tokens
        if generation.encoder is None:
            tokens = eager_tokens(generation.model, prompt.ids, count)
        else:
            assert prompt.source is not None, "an encoder-decoder prompt has an encoder input"
            start = int(prompt.ids[0, 0])
            tokens = eager_seq2seq_tokens(generation.model, prompt.source, start, count)
        generation.references[prompt.name] = tokens
    return tokens


def expected_tokens(generation: Generation) -> list[int]:
    """Eager transformers' greedy tokens from the example prompt (computed once)."""
    return reference(generation, generation.prompts()[0])


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
        program = None
        if encoder is not None:
            assert encoder.program is not None, "the encoder program is made first"
            program = encoder.program.module()

        def generate(prompt: Prompt, expected: list[int]) -> list[int]:
            hidden = None
            if program is not None:
                hidden = _encoded(lambda source: program(**source), prompt)
            step = _step(lambda kwargs: [module(**kwargs)], hidden)
            return cached_tokens(step, prompt.ids, generation.max_new_tokens, expected)

        result = checked(generation, generate)
    return GenerationReport(
        max_cache_len=generation.max_cache_len,
        inputs=INPUTS if encoder is None else DECODER_INPUTS,
        outputs=OUTPUTS,
        check=result,
    )


def runner_check(
    flat: FlatRunner,
    generation: Generation,
    encoder_flat: FlatRunner | None = None,
    *,
    whole: bool = False,
) -> GenerationCheck:
    """A static-cache artifact's greedy generation, run through its runtime's runner
    (`engine.targets.FlatRunner`: its last output is the logits), every prompt on the
    same loaded artifact. The runtime keeps the cache between calls; a run starting again
    at position 0 must not see what earlier runs left in it. An encoder-decoder model's
    decoder artifact is fed `encoder_flat`'s output on each run's encoder input (the same
    runtime's encoder). A run stops at its first difference unless `whole`."""
    if generation.encoder is not None:
        assert encoder_flat is not None, "an encoder-decoder artifact needs its encoder"

    def generate(prompt: Prompt, expected: list[int]) -> list[int]:
        hidden = None
        if encoder_flat is not None:
            hidden = _encoded(lambda source: encoder_flat((), source)[-1], prompt)
        step = _step(lambda kwargs: flat((), kwargs), hidden)
        return cached_tokens(
            step, prompt.ids, generation.max_new_tokens, None if whole else expected
        )

    return checked(generation, generate)


def onnx_check(
    flat: FlatRunner,
    made: PastProgram,
    generation: Generation,
    encoder_flat: FlatRunner | None = None,
    *,
    whole: bool = False,
) -> GenerationCheck:
    """The ONNX model's greedy generation (`onnx_past.past_tokens`: the cache goes in and
    out), every prompt on the same ONNX Runtime session; a run stops at its first
    difference unless `whole`."""
    return checked(
        generation,
        lambda prompt, expected: past_tokens(
            flat, made, generation, encoder_flat, prompt, None if whole else expected
        ),
    )


def _encoded(
    encode: Callable[[dict[str, torch.Tensor]], torch.Tensor], prompt: Prompt
) -> Callable[[], torch.Tensor]:
    """The encoder's output on `prompt`'s encoder input, when called."""
    assert prompt.source is not None, "an encoder-decoder prompt has an encoder input"
    source = dict(prompt.source)

    def hidden() -> torch.Tensor:
        return encode(source)

    return hidden


def _step(
    run: Callable[[dict[str, Any]], Sequence[Any]],
    hidden: Callable[[], torch.Tensor] | None = None,
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


def checked(
    generation: Generation, generate: Generate, stops: Collection[int] = ()
) -> GenerationCheck:
    """`generate`'s tokens against eager transformers' for each of `generation`'s prompts,
    run in order (`Generation.prompts`): the first run in the check's own fields, the
    others in `runs`; `matched` only when every run matched. A loop that ends a sequence
    at one of `stops` (end-of-sequence tokens) is compared with eager's tokens up to and
    including the first of them."""
    first, *others = generation.prompts()
    references = [_until(reference(generation, prompt), stops) for prompt in (first, *others)]
    started = time.perf_counter()
    result = check(references[0], lambda: generate(first, references[0]), first.ids.shape[1])
    runs = []
    for prompt, expected in zip(others, references[1:], strict=True):
        generated = generate(prompt, expected)
        mismatch = first_difference(expected, generated)
        runs.append(
            GenerationRun(
                prompt="second" if prompt.name == "second" else "example",
                prompt_ids=_ids(prompt.ids),
                encoder_input_ids=_source_ids(prompt),
                matched=mismatch is None,
                first_mismatch=mismatch,
                expected=expected,
                generated=generated,
            )
        )
    first_noise = _noise(
        generation, first, result.expected, result.generated, result.first_mismatch
    )
    runs = [
        run.model_copy(
            update=_noise(generation, prompt, run.expected, run.generated, run.first_mismatch)
        )
        for run, prompt in zip(runs, others, strict=True)
    ]
    return result.model_copy(
        update={
            "max_new_tokens": generation.max_new_tokens,
            "prompt_ids": _ids(first.ids),
            "encoder_input_ids": _source_ids(first),
            "runs": runs,
            "matched": result.matched and all(run.matched for run in runs),
            **first_noise,
            "passed": (result.matched or first_noise.get("within_noise") is True)
            and all(run.matched or run.within_noise is True for run in runs),
            "duration_s": time.perf_counter() - started,
        }
    )


def _until(tokens: list[int], stops: Collection[int]) -> list[int]:
    """`tokens` up to and including the first of `stops`."""
    end = next((i for i, token in enumerate(tokens) if token in stops), len(tokens) - 1)
    return tokens[: end + 1]


def _noise(
    generation: Generation,
    prompt: Prompt,
    expected: list[int],
    generated: list[int],
    index: int | None,
) -> dict[str, Any]:
    """A differing run of a reduced-precision decoder-only model judged against the
    dtype's noise (engine.generation.noise); nothing for the others."""
    if index is None or generation.encoder is not None:
        return {}
    if not noise.reduced_model(generation.model):
        return {}
    token = generated[index] if index < len(generated) else None
    key = (prompt.name, index, token)  # the example prompt's restart often parts alike
    if key not in generation.judged:
        generation.judged[key] = noise.judged(
            generation.model, prompt.ids, expected, generated, index
        )
    return generation.judged[key]


def _ids(tokens: torch.Tensor) -> list[int]:
    return [int(token) for token in tokens.flatten()]


def _source_ids(prompt: Prompt) -> list[int] | None:
    ids = (prompt.source or {}).get("input_ids")
    return None if ids is None else _ids(ids)


def nearly_constant(tokens: Sequence[int]) -> bool:
    """Whether a reference sequence says little about a cache: of at least
    `CONSTANT_MIN_TOKENS` tokens, one token makes up half of them or more, or there are
    at most a quarter as many distinct tokens as tokens (a short cycle)."""
    if len(tokens) < CONSTANT_MIN_TOKENS:
        return False
    most = Counter(tokens).most_common(1)[0][1]
    return 2 * most >= len(tokens) or 4 * len(set(tokens)) <= len(tokens)


def constant_warnings(result: GenerationCheck | None) -> list[ReportWarning]:
    """`generation_nearly_constant` for each prompt whose eager tokens are
    `nearly_constant`: a program or artifact that ignored its cache could still match
    them."""
    if result is None:
        return []
    warnings = []
    seen: set[str] = set()
    runs = [("example", result.prompt_ids, result.expected)] + [
        (run.prompt, run.prompt_ids, run.expected) for run in result.runs
    ]
    for prompt, ids, tokens in runs:
        if prompt in seen or not nearly_constant(tokens):
            continue
        seen.add(prompt)
        token, count = Counter(tokens).most_common(1)[0]
        warnings.append(
            ReportWarning(
                code="generation_nearly_constant",
                message=f"Eager transformers' greedy tokens from the {prompt} prompt are nearly "
                f"constant (token {token} is {count} of {len(tokens)}, {len(set(tokens))} "
                "distinct): matching them says little about the KV cache. A trained "
                "checkpoint, or other random weights, checks it better.",
                details={
                    "prompt": prompt,
                    "prompt_ids": ids,
                    "tokens": tokens,
                    "distinct": len(set(tokens)),
                    "token": token,
                    "count": count,
                },
            )
        )
    return warnings


def mismatch_details(result: GenerationCheck) -> dict[str, Any]:
    """Where a failed check first differs: `run` (0 = the first, then `runs` in order),
    `prompt`, `restart` (whether that run started again at position 0 after another),
    `first_mismatch` and the `expected` and `got` tokens there."""
    run, prompt, index = 0, "example", result.first_mismatch
    expected, generated = result.expected, result.generated
    if index is None or result.within_noise:
        index = None
        for number, later in enumerate(result.runs, start=1):
            if not later.matched and not later.within_noise:
                run, prompt, index = number, later.prompt, later.first_mismatch
                expected, generated = later.expected, later.generated
                break
    return {
        "run": run,
        "prompt": prompt,
        "restart": run > 0,
        "first_mismatch": index,
        "expected": expected[index] if index is not None and index < len(expected) else None,
        "got": generated[index] if index is not None and index < len(generated) else None,
    }


def mismatch_text(result: GenerationCheck) -> str:
    """Where a failed check first differs, in words."""
    found = mismatch_details(result)
    where = f"at generated token {found['first_mismatch']}"
    if found["restart"]:
        where += f" of the {found['prompt']} prompt started again at position 0"
    return f"{where} (expected {found['expected']}, got {found['got']})"


def mismatch_error(result: GenerationCheck) -> VerificationFailed:
    """`verification_failed` for a program whose generation differs from eager."""
    found = mismatch_details(result)
    hint = (
        "The program kept state from the run before: its KV cache did not export "
        "faithfully; report the model type."
        if found["restart"]
        else "The KV cache did not export faithfully; report the model type."
    )
    return VerificationFailed(
        f"The exported program's greedy generation differs from eager transformers "
        f"{mismatch_text(result)}.",
        hint=hint + " Set generation.cache to false to export the plain forward instead.",
        details={"reason": "generation_mismatch", **found},
    )
