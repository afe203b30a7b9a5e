"""The generation check of a generation-ready export (`report.generation.check`,
`report.targets.<name>.generation`): greedy tokens against eager transformers'."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas._base import StrictModel
from schemas.quantization import QuantizationReport

__all__ = ["GenerationCheck", "GenerationPrompt", "GenerationRun"]

GenerationPrompt = Literal["example", "second"]


class NoiseJudgement(StrictModel):
    """How a run whose tokens differ in reduced precision was judged (the first run's in
    `GenerationCheck`'s own fields, each later run's in its `GenerationRun`)."""

    within_noise: bool | None = Field(
        default=None,
        description="Set when the tokens differ and the model runs in bfloat16 or float16: "
        "whether, at `first_mismatch`, eager's own logit margin between its token and this "
        "artifact's (`margin`) is at most twice the error eager makes in that dtype "
        "against a float32 run of the same weights at that step (`noise`). A run whose first "
        "mismatch is within the noise passes the check; the tokens after it are not compared.",
    )
    margin: float | None = Field(
        default=None,
        description="Eager's logit of its own token minus its logit of this artifact's token "
        "at `first_mismatch` (with `within_noise`).",
    )
    noise: float | None = Field(
        default=None,
        description="max |eager - float32 reference| of the logits at `first_mismatch` "
        "(with `within_noise`).",
    )


class GenerationRun(NoiseJudgement):
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


class GenerationCheck(NoiseJudgement):
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
    passed: bool | None = Field(
        default=None,
        description="The check's verdict: every run matched, or first differs within the "
        "dtype's noise (`within_noise`). Null in reports written before torchport judged "
        "noise: read `matched`.",
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
