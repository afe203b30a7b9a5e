"""`report.quantization`: what quantizing each deployment target cost in accuracy.

Option `quantize` quantizes the targets (program.pt2 stays float); each quantized target
is compared with the float eager model on the verification samples, and passes or fails
the accuracy budget (`quantize.min_cosine` or `quantize.max_abs`). Keyed by target name,
as `report.targets` is (docs/contract.md §4, docs/targets.md *Quantization*).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas._base import StrictModel


class QuantizedOutput(StrictModel):
    """One output of a quantized artifact against the float eager model, over the samples."""

    path: str = Field(description='The output, named as the verification names it, e.g. "[0]".')
    cosine: float | None = Field(
        default=None,
        description="The lowest cosine similarity over the samples (the flattened output); "
        "null for a non-float output.",
    )
    max_abs: float | None = Field(
        default=None, description="The largest abs error over the samples."
    )
    mean_abs: float | None = Field(
        default=None, description="The mean abs error over the samples' elements."
    )
    top1_agreement: float | None = Field(
        default=None,
        description="For a classification-shaped output (2-D, or named `logits`): the share "
        "of rows whose arg max over the last dim equals the float model's.",
    )


class GeneratedTokens(StrictModel):
    """Greedy generation of a quantized `text-generation` artifact against float eager."""

    matched: int = Field(description="Generated tokens equal to float eager's, from the first.")
    max_new_tokens: int = Field(description="Tokens generated (`generation.max_new_tokens`).")
    expected: list[int] = Field(default_factory=list, description="Float eager's tokens.")
    generated: list[int] = Field(default_factory=list, description="The artifact's tokens.")


class QuantizedTarget(StrictModel):
    """One target's quantized artifact against the float eager model."""

    measured: bool = Field(
        description="Whether the accuracy was measured (false: the target failed before, or "
        "verification is off)."
    )
    passed: bool | None = Field(
        default=None, description="Within the budget; null when not measured."
    )
    cosine: float | None = Field(
        default=None, description="The lowest cosine over the outputs and samples."
    )
    max_abs_error: float | None = Field(
        default=None, description="The largest abs error over the outputs and samples."
    )
    top1_agreement: float | None = Field(
        default=None, description="The lowest top-1 agreement over classification outputs."
    )
    samples: int = Field(default=0, description="Samples compared (the example included).")
    outputs: list[QuantizedOutput] = Field(default_factory=list)
    generation: GeneratedTokens | None = Field(
        default=None, description="For a `text-generation` job: greedy tokens compared."
    )
    method: str | None = Field(
        default=None,
        description='How the target was quantized, e.g. "pt2e XNNPACKQuantizer static '
        'per-channel" or "onnxruntime quantize_static QDQ".',
    )


class QuantizationReport(StrictModel):
    """The job's quantization: the scheme, the budget and each target's accuracy."""

    scheme: str = Field(description="`quantize.scheme`.")
    budget: Literal["min_cosine", "max_abs"] = Field(
        default="min_cosine", description="Which budget decides `passed`."
    )
    min_cosine: float | None = Field(default=None, description="`quantize.min_cosine`.")
    max_abs: float | None = Field(default=None, description="`quantize.max_abs`.")
    group_size: int | None = Field(
        default=None, description="`quantize.group_size`, for the grouped schemes."
    )
    calibration_samples: int | None = Field(
        default=None, description="Inputs `int8` was calibrated on."
    )
    calibration_source: Literal["upload", "samples"] | None = Field(
        default=None,
        description="Where `int8`'s calibration inputs came from: the job's `calibration` "
        "upload, or the example and the verification samples.",
    )
    targets: dict[str, QuantizedTarget] = Field(
        default_factory=dict, description="By target name, as `report.targets`."
    )
