"""`report.json`: what happened in every stage of an export."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from schemas._base import SCHEMA_VERSION, StrictModel
from schemas.dynamic_shapes import DynamicShapesSpec
from schemas.errors import ErrorBody, SourceLocation, Stage
from schemas.generation import GenerationCheck
from schemas.graph import Shape
from schemas.profile import ProfileReport
from schemas.quantization import QuantizationReport
from schemas.upload_report import CheckpointReport, InputSummary, ModelSummary, WeightsReport

StageStatus = Literal["succeeded", "failed", "skipped"]


class StageRecord(StrictModel):
    """One stage: how long it took and how it ended."""

    name: Stage
    status: StageStatus
    duration_s: float
    message: str | None = None
    peak_rss_mb: float | None = Field(
        default=None,
        description="The most resident memory the export's process held during the stage, "
        "in MB (null where /proc is unreadable).",
    )


class TraceAttempt(StrictModel):
    """One call of `torch.export.export`."""

    strict: bool
    dynamic_shapes: DynamicShapesSpec | None = None
    succeeded: bool
    duration_s: float
    error: ErrorBody | None = None


class DynamicShapeFix(StrictModel):
    """One fix torch suggested and the engine applied."""

    text: str = Field(description="As torch printed it, e.g. \"dimx = Dim('dimx', max=6)\".")
    name: str | None = None
    spec: Any = Field(default=None, description="The same fix in the contract's JSON form.")


class DynamicShapesReport(StrictModel):
    """The spec asked for, the spec used, and what changed in between."""

    requested: DynamicShapesSpec | None = None
    applied: DynamicShapesSpec | None = None
    fixes: list[DynamicShapeFix] = Field(default_factory=list)
    source: Literal["options", "module", "checkpoint", "none"] = "none"
    suggested: DynamicShapesSpec | None = Field(
        default=None,
        description="For an export without dynamic shapes (source none): a spec the engine "
        "proposes from the example inputs — dim 0 of every tensor input as a shared `batch` "
        "when their sizes are equal, dim 1 of rank-2 integer tensors (token ids, masks) as "
        "`seq` (names shared where sizes are equal, only sizes > 1). Not validated by a "
        "trace: torch may still refuse it (then `auto_fix_dynamic_shapes` applies its fixes).",
    )


class TracingReport(StrictModel):
    """Every tracing attempt and the mode that succeeded."""

    attempts: list[TraceAttempt] = Field(default_factory=list)
    strict_used: bool | None = None
    dynamic_shapes: DynamicShapesReport = Field(default_factory=DynamicShapesReport)


class DecompositionReport(StrictModel):
    """Ops before and after decomposition."""

    mode: str
    preserve: list[str] = Field(default_factory=list)
    ops_before: dict[str, int] = Field(default_factory=dict)
    ops_after: dict[str, int] = Field(default_factory=dict)
    removed_ops: list[str] = Field(default_factory=list)
    added_ops: list[str] = Field(default_factory=list)
    non_core_aten_ops: list[str] = Field(
        default_factory=list, description="Ops of the final graph outside the core ATen set."
    )
    kept_after_failure: list[str] = Field(
        default_factory=list,
        description="Ops kept undecomposed because decomposing them failed.",
    )


class PrecisionCheck(StrictModel):
    """A reduced-precision (bfloat16, float16) output judged against a float32 reference
    of the same weights, when it is outside the dtype's tolerance from eager's."""

    reference: Literal["float32"] = Field(
        default="float32",
        description="The reference: the eager model run with float32 arithmetic on its own "
        "reduced-precision weights.",
    )
    eager_error: float = Field(description="max |eager - reference|: eager's own error.")
    exported_error: float = Field(description="max |exported - reference|.")
    ratio: float = Field(
        description="The passing bound: `exported_error <= ratio * eager_error + atol`."
    )
    passed: bool


class OutputCheck(StrictModel):
    """Exported vs eager for one output leaf."""

    path: str
    shape: Shape | None = None
    dtype: str | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = Field(default=None, description="max |e - a| / (|e| + 1e-7).")
    atol: float | None = None
    rtol: float | None = None
    passed: bool
    message: str | None = None
    precision: PrecisionCheck | None = Field(
        default=None,
        description="Set when a bfloat16/float16 output was outside the tolerance from "
        "eager's and was judged against a float32 reference instead (`passed` is then that "
        "judgement's).",
    )


class SampleCheck(StrictModel):
    """One run on inputs drawn inside the dynamic ranges."""

    label: str = Field(description='"example", "min", "max" or "random-N".')
    symbols: dict[str, int] = Field(default_factory=dict)
    input_shapes: dict[str, Shape] = Field(default_factory=dict)
    status: Literal["passed", "failed", "skipped"]
    reason: str | None = None
    outputs: list[OutputCheck] = Field(default_factory=list)
    buffers: list[OutputCheck] = Field(default_factory=list)
    cost: float | None = Field(
        default=None, description="The sample's input elements over the example's."
    )
    bound: Literal["max_sample_cost", "memory_mb", "runtime"] | None = Field(
        default=None,
        description="The bound that skipped the sample, if one did (`runtime`: a target's "
        "runtime refused it, and option `target_range` kept the target for the range it ran).",
    )
    eager_s: float | None = Field(
        default=None,
        description="Seconds the eager model's run on this sample took (null when it did not run).",
    )
    exported_s: float | None = Field(
        default=None,
        description="Seconds the program's run (or a deployment target's) on this sample "
        "took (null when it did not run).",
    )


class RoundtripCheck(StrictModel):
    """The saved program loaded in a fresh torch-only process and run."""

    status: Literal["passed", "failed", "skipped"]
    bitwise_equal: bool | None = None
    quantization: QuantizationReport | None = Field(
        default=None,
        description="Option `quantize`: the scheme, the accuracy budget and each quantized "
        "target's accuracy against the float eager model; null when not quantized.",
    )
    duration_s: float | None = None
    save_s: float | None = Field(
        default=None,
        description="Seconds `torch.export.save` of the program took (in the sandbox at the "
        "start of `verifying`, while the loader then loads it); null for other artifacts.",
    )
    loader: str | None = Field(default=None, description="Where the load ran.")
    reason: str | None = None
    outputs: list[OutputCheck] = Field(default_factory=list)


VerificationVerdict = Literal["verified", "partially_verified", "failed", "disabled"]


class VerificationReport(StrictModel):
    """All comparisons against eager."""

    enabled: bool
    passed: bool | None = Field(
        default=None,
        description="No check failed (kept for compatibility: also true when samples were "
        "skipped; `verdict` tells verified from partially verified); null when disabled.",
    )
    verdict: VerificationVerdict | None = Field(
        default=None,
        description="`verified`: every sample checked and passed; `partially_verified`: none "
        "failed but some were skipped; `failed`: a check failed; `disabled`: not run. "
        "Derived from `enabled`, `passed` and `samples` when not given.",
    )
    checked: int | None = Field(
        default=None, description="Samples compared (passed or failed); derived when not given."
    )
    skipped: int | None = Field(
        default=None, description="Samples skipped (see their `reason`); derived when not given."
    )
    samples: list[SampleCheck] = Field(default_factory=list)
    roundtrip: RoundtripCheck | None = None
    quantization: QuantizationReport | None = Field(
        default=None,
        description="Option `quantize`: the scheme, the accuracy budget and each quantized "
        "target's accuracy against the float eager model; null when not quantized.",
    )
    duration_s: float | None = None

    @model_validator(mode="after")
    def _derive_verdict(self) -> VerificationReport:
        # Reports written before `verdict` existed get theirs from what they hold.
        if self.checked is None:
            self.checked = sum(s.status != "skipped" for s in self.samples)
        if self.skipped is None:
            self.skipped = sum(s.status == "skipped" for s in self.samples)
        if self.verdict is None:
            self.verdict = verdict_of(self)
        return self


def verdict_of(report: VerificationReport) -> VerificationVerdict:
    """The verdict `report`'s samples support: verified only when none was skipped."""
    if not report.enabled:
        return "disabled"
    if report.passed is False or any(s.status == "failed" for s in report.samples):
        return "failed"
    if any(s.status == "skipped" for s in report.samples):
        return "partially_verified"
    return "verified"


class EncoderReport(StrictModel):
    """An encoder-decoder model's encoder program (`encoder.pt2`), made beside the
    decoder (the job's `program.pt2`): traced, decomposed and verified as the program is."""

    artifact: str = Field(default="encoder.pt2", description="The file it is saved as.")
    inputs: list[str] = Field(
        default_factory=list,
        description='Its input: `["input_ids"]` (text) or `["input_features"]` (speech); its '
        "output is the last hidden state, the decoder's `encoder_hidden_states`.",
    )
    input_shape: list[int | str] = Field(
        default_factory=list,
        description="The example input's shape; a dynamic dim appears as its name, e.g. "
        '`[1, "encoder_sequence_length"]`.',
    )
    verification: VerificationReport | None = Field(
        default=None,
        description="The encoder program against the eager encoder, on the example and on "
        "samples of `encoder_sequence_length` (as `report.verification` for the program); "
        "null when verify is off.",
    )
    roundtrip: RoundtripCheck | None = Field(
        default=None,
        description="`encoder.pt2` loaded in a fresh torch-only process and run, as "
        "`program.pt2`'s round trip.",
    )


class GenerationReport(StrictModel):
    """How a checkpoint was made generation-ready: a decoder-only LM (`text-generation`)
    or an encoder-decoder one (`text2text-generation`, speech-to-text)."""

    cache: Literal["static"] = Field(
        default="static",
        description="`static`: the KV cache is a set of mutable buffers of the program "
        "(`max_cache_len` tokens, batch 1); one method serves prefill and decode.",
    )
    max_cache_len: int
    batch_size: int = 1
    inputs: list[str] = Field(
        default_factory=list,
        description='The program\'s inputs: `["input_ids", "cache_position"]`; an '
        'encoder-decoder model\'s decoder: `["decoder_input_ids", "encoder_hidden_states", '
        '"cache_position"]`.',
    )
    outputs: list[str] = Field(
        default_factory=list,
        description='The program\'s user outputs by name, in order: `["logits"]` ([batch, '
        "tokens, vocabulary]), as the ONNX model names them; signature.json names them by "
        "graph node (`view_55`). Empty in reports written before torchport said so.",
    )
    check: GenerationCheck | None = Field(
        default=None, description="The program's generation check; null when verify is off."
    )
    encoder: EncoderReport | None = Field(
        default=None,
        description="An encoder-decoder model's encoder program; null for a decoder-only "
        "model. The generation check then runs the encoder program once and the decoder "
        "from the decoder start token.",
    )


class TargetResult(StrictModel):
    """One deployment target: its artifact, and the artifact run against eager PyTorch."""

    status: Literal["succeeded", "failed", "skipped"]
    artifact: str | None = Field(
        default=None, description='The file written, e.g. "model.onnx"; null unless succeeded.'
    )
    size: int | None = Field(default=None, description="The artifact's size in bytes.")
    artifacts: list[str] = Field(
        default_factory=list,
        description="Every file the target wrote, `artifact` first, then the files it needs "
        "beside it (`model.onnx.data`: the weights of an ONNX model with external data).",
    )
    duration_s: float | None = Field(default=None, description="Time to convert (not to verify).")
    verification: VerificationReport | None = Field(
        default=None,
        description="The artifact, loaded by its own runtime, against eager PyTorch on the "
        "samples the program's verification draws (same tolerances, same table).",
    )
    encoder: VerificationReport | None = Field(
        default=None,
        description="An encoder-decoder model's encoder in this target (`encoder.onnx`, "
        "`encoder.aoti.pt2`, the `encoder` method of `model.pte`) against the eager "
        "encoder, on the encoder program's samples; null for other models.",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What to know when deploying it: dynamic ranges not enforced, the ISA.",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="Machine-readable facts, e.g. for `aoti` the `isa` asked for, the `march` "
        "and `vec_isa` used; the runtime's and converter's versions.",
    )
    generation: GenerationCheck | None = Field(
        default=None,
        description="For a generation-ready export: the artifact's greedy generation against "
        "eager transformers.",
    )
    runtime_generation: GenerationCheck | None = Field(
        default=None,
        description="The same check run by the runtime's own generation loop on the "
        "artifact as delivered: for `onnx`, ONNX Runtime GenAI's `Generator` on the folder "
        "(`genai_config.json` beside `model.onnx`) when the worker has onnxruntime-genai; "
        "for a decoder-only LLM's `executorch`, ExecuTorch's `TextLLMRunner` on `model.pte` "
        "(fed the prompts' ids through a numbered tokenizer; each run compared up to the "
        "first end-of-sequence token, where the runner stops); "
        "null otherwise.",
    )
    error: ErrorBody | None = Field(
        default=None, description="`target_failed`, with `details.target`; null unless failed."
    )


class ReportWarning(StrictModel):
    """Something the user should know that did not stop the export."""

    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class DraftIssue(StrictModel):
    """One issue found by `torch.export.draft_export`."""

    type: str
    message: str
    location: SourceLocation | None = None
    hint: str | None = None
    xfail: bool = False
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="Machine-readable facts: the guard expression, its symbols, the operator.",
    )


class Environment(StrictModel):
    """Versions and machine."""

    torchport: str
    torch: str | None = None
    python: str
    platform: str
    device: str | None = None
    cuda: str | None = None
    gpu: str | None = None
    libraries: dict[str, str] = Field(
        default_factory=dict,
        description="Third-party distributions the upload imported (while loading), with "
        'their versions, e.g. {"torch": "2.13.0", "transformers": "5.23.0"}; torch always.',
    )


class ArtifactInfo(StrictModel):
    """One file a succeeded job produced."""

    name: str
    size: int
    sha256: str


class SandboxReport(StrictModel):
    """The isolation layers the job ran under."""

    layers: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class ReportDocument(StrictModel):
    """The top level of `report.json`."""

    schema_version: str = SCHEMA_VERSION
    status: Literal["succeeded", "failed"]
    stages: list[StageRecord] = Field(default_factory=list)
    tracing: TracingReport = Field(default_factory=TracingReport)
    decomposition: DecompositionReport | None = None
    verification: VerificationReport | None = None
    model: ModelSummary | None = None
    inputs: list[InputSummary] = Field(
        default_factory=list,
        description="The example inputs as loaded, written even when a later stage fails.",
    )
    weights: WeightsReport | None = Field(
        default=None,
        description="How the uploaded weights file was loaded; null without one, or when "
        "loading it failed (the error says why).",
    )
    warnings: list[ReportWarning] = Field(default_factory=list)
    error: ErrorBody | None = None
    draft_export: list[DraftIssue] | None = None
    targets: dict[str, TargetResult] = Field(
        default_factory=dict,
        description="Per deployment target asked for in `options.targets`: how its conversion "
        "and verification went (`skipped` when the export failed before it).",
    )
    environment: Environment
    artifacts: list[ArtifactInfo] = Field(default_factory=list)
    sandbox: SandboxReport | None = None
    checkpoint: CheckpointReport | None = Field(
        default=None, description="For a checkpoint upload: the task and how it was chosen."
    )
    generation: GenerationReport | None = Field(
        default=None,
        description="For a `text-generation` checkpoint exported with a KV cache: the cache "
        "and the program's generation check.",
    )
    profile: ProfileReport | None = Field(
        default=None,
        description="Option `profile`: each artifact loaded and run on the worker; null when "
        "not profiled.",
    )
    quantization: QuantizationReport | None = Field(
        default=None,
        description="Option `quantize`: the scheme, the accuracy budget and each quantized "
        "target's accuracy against the float eager model; null when not quantized.",
    )
    duration_s: float | None = None
