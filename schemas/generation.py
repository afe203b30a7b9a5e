"""The generation check of a generation-ready export (`report.generation.check`,
`report.targets.<name>.generation`): greedy tokens against eager transformers'."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas._base import StrictModel
from schemas.quantization import QuantizationReport

__all__ = ["GenerationCheck", "GenerationPrompt", "GenerationRun"]

GenerationPrompt = Literal["example", "second"]


class GenerationRun(StrictModel):
    """One more greedy generation on the same loaded program or artifact, started again
    at position 0 while its cache still holds what the run before it wrote."""

    prompt: GenerationPrompt = Field(
        description="`second`: the second prompt; `example`: the example prompt again."
    )
    prompt_ids: list[int] = Field(
        default_factory=list,
        description="The prompt's token ids (an encoder-decoder model's: the decoder start token).",
    )
    encoder_input_ids: list[int] | None = Field(
        default=None,
        description="A text encoder-decoder model's encoder input for this run; null "
        "otherwise (speech: seeded random features).",
    )
    matched: bool = Field(description="Every generated token equals eager transformers' one.")
    first_mismatch: int | None = Field(
        default=None,
        description="Index (0 = the first generated token) of the first token that differs; "
        "null when all match.",
    )
    expected: list[int] = Field(default_factory=list, description="Eager transformers' tokens.")
    generated: list[int] = Field(default_factory=list, description="This artifact's tokens.")


class GenerationCheck(StrictModel):
    """Greedy generation from the example prompt, compared token for token with eager
    transformers (its own forward with a dynamic cache); then, on the same loaded program
    or artifact, the runs of `runs` (a second prompt and the example again, each started
    again at position 0)."""

    max_new_tokens: int = Field(description="Tokens generated after the prompt, in each run.")
    prompt_tokens: int = Field(description="Length of the example prompt.")
    matched: bool = Field(
        description="Every generated token equals eager transformers' one, in the first run "
        "and in each of `runs`."
    )
    first_mismatch: int | None = Field(
        default=None,
        description="Index (0 = the first generated token) of the first token that differs "
        "in the first run; null when all of it match (a later run's is in `runs`).",
    )
    expected: list[int] = Field(
        default_factory=list, description="Eager transformers' tokens (the first run's)."
    )
    generated: list[int] = Field(
        default_factory=list, description="This artifact's tokens (the first run's)."
    )
    prompt_ids: list[int] = Field(
        default_factory=list,
        description="The first run's prompt: the example prompt's token ids (an "
        "encoder-decoder model's: the decoder start token). Empty in reports written "
        "before torchport recorded it.",
    )
    encoder_input_ids: list[int] | None = Field(
        default=None,
        description="A text encoder-decoder model's encoder input of the first run (the "
        "encoder's example); null otherwise.",
    )
    runs: list[GenerationRun] = Field(
        default_factory=list,
        description="The runs after the first, in order on the same loaded program or "
        "artifact, each started again at position 0: the second prompt, then the example "
        "prompt again. Empty in reports written before torchport ran them.",
    )
    quantization: QuantizationReport | None = Field(
        default=None,
        description="Option `quantize`: the scheme, the accuracy budget and each quantized "
        "target's accuracy against the float eager model; null when not quantized.",
    )
    duration_s: float | None = Field(
        default=None, description="Seconds the artifact took to generate, every run together."
    )
