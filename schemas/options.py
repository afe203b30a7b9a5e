"""Export options (docs/contract.md §2): every field optional, unknown fields refused.

`ExportOptions` is what shapes an export, all the engine sees. `SubmittedOptions` is the
`options` field as the API has always accepted it: the same, plus the deprecated
`callback_url`, which belongs to the job (`schemas.job.JobSpec`), not to the export.
"""

from __future__ import annotations

from typing import Annotated, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import Field, StrictBool, field_validator, model_validator

from schemas._base import StrictModel
from schemas.dynamic_shapes import DynamicShapesSpec
from schemas.limits import CALLBACK_URL_MAX_LENGTH, CALLBACK_URL_PATTERN, MAX_TIMEOUT_S


class DecompositionOptions(StrictModel):
    """How the traced program is decomposed."""

    mode: Literal["core_aten", "none", "custom"] = "core_aten"
    preserve: list[str] = Field(
        default_factory=list,
        description='Ops kept undecomposed in `core_aten` mode, e.g. "aten.conv2d.default".',
    )
    decompose: list[str] = Field(
        default_factory=list, description="In `custom` mode, the only ops decomposed."
    )
    keep_failing_ops: bool = Field(
        default=True,
        description=(
            "When run_decompositions fails, find the fewest ops to keep undecomposed so it "
            "passes, and warn; false fails with `decomposition_failed` instead."
        ),
    )
    unroll_recurrent: bool = Field(
        default=False,
        description=(
            "In `core_aten` mode, decompose LSTM, GRU and RNN layers by unrolling them over "
            "their time steps; false keeps them as single ops (warning `recurrent_ops_kept`)."
        ),
    )


class VerifyOptions(StrictModel):
    """Comparison of the exported program against eager PyTorch."""

    enabled: bool = True
    atol: Annotated[float | None, Field(ge=0)] = None
    rtol: Annotated[float | None, Field(ge=0)] = None
    samples: Annotated[int, Field(ge=0, le=64)] = 3
    roundtrip: bool = True
    max_sample_cost: Annotated[
        float | None,
        Field(
            gt=0,
            description="The biggest sample verified, as a multiple of the example's input "
            "elements; bigger ones are skipped (the verdict is then partially_verified). "
            "null: no fixed bound; samples whose estimated peak memory would exceed the "
            "job's memory_mb are skipped either way.",
        ),
    ] = None


class WeightsOptions(StrictModel):
    """How the uploaded `weights` file is loaded into the model."""

    strict: bool = Field(
        default=True,
        description="The file's names must match the model's exactly (else "
        "`weights_mismatch`); false loads the tensors whose names match and reports the "
        "rest (`report.weights.missing`, `.unexpected`, warning `weights_skipped`). Shapes "
        "must match either way, and at least one name.",
    )
    key: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None,
        description="The key of the file's top-level dict holding the state dict, e.g. "
        '"ema"; null: the file itself, or, in a training checkpoint, the first of '
        '"state_dict", "model_state_dict", "model_state", "model", "net" holding one.',
    )


TrainingOption = Literal["eval", "preserve", "refuse"]
"""What an export does with a model left in training mode (option `training`)."""

TargetName = Literal["onnx", "aoti", "executorch"]
"""The deployment targets an export can also produce (docs/targets.md)."""

TaskName = Literal[
    "text-generation",
    "text-classification",
    "token-classification",
    "question-answering",
    "fill-mask",
    "feature-extraction",
    "image-classification",
    "object-detection",
    "semantic-segmentation",
    "automatic-speech-recognition",
    "text2text-generation",
]
"""What a checkpoint upload (a `save_pretrained` directory) is exported for, named as
optimum names its tasks (docs/contract.md §1, *Checkpoints*)."""

MAX_CACHE_LEN = 8192
"""The largest static KV cache (`generation.max_cache_len`) a job may ask for."""
DEFAULT_MAX_CACHE_LEN = 1024
"""`generation.max_cache_len` when unset, unless the model's own context is shorter."""


class GenerationOptions(StrictModel):
    """A `text-generation` checkpoint exported ready to generate: with a KV cache."""

    cache: bool | None = Field(
        default=None,
        description="Export with a static KV cache (program.pt2, aoti, executorch: one "
        "program for prefill and decode, the cache in mutable buffers; onnx: "
        "`past_key_values.{i}.key|value` inputs and `present.{i}.key|value` outputs); "
        "false: the plain forward (logits of a whole sequence, no cache); null: with the "
        "cache where transformers can give the model one, else the plain forward with "
        "warning `generation_not_ready`; true: the cache or `model_not_found`.",
    )
    max_cache_len: Annotated[int, Field(ge=32, le=MAX_CACHE_LEN)] | None = Field(
        default=None,
        description="Tokens the static cache holds (prompt and generated together); null: "
        f"{DEFAULT_MAX_CACHE_LEN}, or the model's `max_position_embeddings` when smaller.",
    )
    max_new_tokens: Annotated[int, Field(ge=1, le=256)] = Field(
        default=16,
        description="Tokens generated greedily from the example prompt to verify the program "
        "and each target against eager transformers, token for token.",
    )


AotiIsa = Literal["portable", "native", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"]


class AotiOptions(StrictModel):
    """How the AOTInductor package (target `aoti`) is compiled."""

    isa: AotiIsa = Field(
        default="portable",
        description=(
            "The x86-64 instruction set the compiled kernels may use. `portable`: "
            "x86-64-v3 (AVX2, FMA: Intel Haswell / AMD Zen and later) with AVX2 kernels; "
            "`native`: torch's default, `-march=native` and the widest vector ISA of the "
            "worker (the package may not run on another CPU); `x86-64` or `x86-64-v2`: "
            "scalar kernels, any x86-64 CPU; `x86-64-v4`: AVX-512 kernels. The worker must "
            "support the level (the package is run there for verification)."
        ),
    )


ONNX_OPSETS = (18, 25)
"""The ONNX opsets option `onnx.opset` may ask for: torch's exporter (torchlib) writes 18 and
later, ONNX Runtime 1.32 (the verifier) runs up to 25."""


class OnnxOptions(StrictModel):
    """How the ONNX model (target `onnx`) is written."""

    opset: Annotated[int, Field(ge=ONNX_OPSETS[0], le=ONNX_OPSETS[1])] | None = Field(
        default=None,
        description="The ONNX opset (default domain) of the model; null: the exporter's "
        "default (20 with torch 2.13).",
    )
    dtype: Literal["float32", "float16"] = Field(
        default="float32",
        description="`float32`: weights and computation in float32, a bfloat16 or float16 "
        "model's widened (ONNX Runtime's CPU provider lacks kernels in those for most ops). "
        "`float16`: the model's float32 weights and computation converted to "
        "float16 (inputs and outputs stay float32), verified with the looser float16 "
        "tolerances unless verify.atol/rtol are set.",
    )
    external_data: StrictBool | Literal["auto"] = Field(
        default="auto",
        description="Write the weights to `model.onnx.data` beside `model.onnx`: `auto` when "
        "they exceed 1.5 GB (protobuf cannot hold a model over 2 GB in one file) and always "
        "for a generation-ready LLM (as ONNX Runtime GenAI's builder writes one), `true` "
        "always, `false` never (a model over 2 GB then fails).",
    )
    custom_ops: StrictBool = Field(
        default=True,
        description="A generation-ready decoder-only LLM's attention as ONNX Runtime's "
        "`com.microsoft::GroupQueryAttention` node (one node per layer over the key/value "
        "heads as they are, as ONNX Runtime GenAI's model builder writes it; its "
        "`attention_mask` gives each row's length, new tokens last, and ONNX Runtime runs "
        "new tokens after a past in batches of one), where it fits the model; false: "
        "attention in standard ONNX ops, which any ONNX runtime runs, under any mask.",
    )


class ExecutorchOptions(StrictModel):
    """How the ExecuTorch program (target `executorch`) is lowered."""

    custom_ops: bool = Field(
        default=True,
        description="A generation-ready LLM's attention through ExecuTorch's LLM custom ops "
        "(`llama::update_cache`, `llama::custom_sdpa`: attention over the filled part of "
        "the cache only, as `export_llm` and optimum-executorch lower it; the runtime must "
        "have their kernels: in Python, import `executorch.extension.llm.custom_ops`), "
        "where they fit the model; "
        "false: the recipe's attention over the whole cache in standard ops, which any "
        "ExecuTorch runtime with XNNPACK runs.",
    )
    dtype: Literal["float32", "model"] = Field(
        default="float32",
        description="`float32`: a generation-ready LLM computing in bfloat16 or float16 is "
        "lowered in float32, its weights widened (as optimum-executorch's default dtype "
        "loads it), so its attention takes the custom ops (`custom_ops`) and XNNPACK's "
        "float32 kernels; the `.pte` holds float32 weights and returns float32 logits. "
        "`model`: lowered in the model's dtype, with the recipe's attention.",
    )


class ProfileOptions(StrictModel):
    """Profiles of the job's artifacts on the worker (`report.profile`)."""

    enabled: bool | None = Field(
        default=None,
        description="Profile the eager model, program.pt2 and each succeeded target: latency "
        "at 1 thread and at the worker's threads, load time, peak memory, size. Null: on when "
        "`targets` asks for any.",
    )
    runs: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=20, description="Timed runs per artifact and thread count (at most)."
    )
    warmup: Annotated[int, Field(ge=0, le=100)] = Field(
        default=2, description="Untimed runs before the timed ones."
    )
    budget_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30,
        description="Seconds all profiles may take together, loads included (each artifact "
        "and thread count gets an equal share of what is left, and runs at least once); "
        "never more than half of what `timeout_s` leaves. Profiles count against the job's "
        "`timeout_s`.",
    )


QuantizationScheme = Literal[
    "none", "int8", "int8_dynamic", "int8_weight_only", "int4_weight_only", "8da4w"
]
"""The quantization schemes option `quantize.scheme` names, as torchao and ExecuTorch name
them (docs/targets.md, *Quantization*)."""


class QuantizeOptions(StrictModel):
    """Quantization of the deployment targets, and the accuracy it may cost."""

    scheme: QuantizationScheme = Field(
        default="none",
        description="`int8`: static int8 through PT2E (XNNPACK quantizer: per-channel "
        "symmetric weights, per-tensor activations calibrated on the verification samples); "
        "`int8_dynamic`: int8 weights, activations quantized at run time; "
        "`int8_weight_only`, `int4_weight_only`: torchao weight-only linears; `8da4w`: "
        "torchao 8-bit dynamic activations, 4-bit grouped weights for linears. "
        "program.pt2 stays float; each target quantizes what it can take.",
    )
    group_size: Literal[32, 64, 128, 256] = Field(
        default=32, description="Weights per scale for `int4_weight_only` and `8da4w`."
    )
    min_cosine: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.99,
        description="The accuracy budget: the lowest cosine similarity against the float "
        "eager model any output may have on any verification sample.",
    )
    max_abs: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="The accuracy budget as the largest abs error against the float eager "
        "model instead of `min_cosine`.",
    )


class ExportOptions(StrictModel):
    """Everything a user can ask of one export."""

    symbol: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "model"
    entry: str | None = Field(
        default=None, description="The entry file inside a zip upload, e.g. `pkg/net.py`."
    )
    task: TaskName | None = Field(
        default=None,
        description="For a checkpoint upload (a zip of a `save_pretrained` directory): the "
        "task whose model class is built from the config; null infers it from "
        "`config.architectures`. Ignored for Python uploads.",
    )
    adapter: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        default=None,
        description="For a checkpoint upload: the folder of the zip, relative to the "
        "checkpoint's `config.json`, holding the PEFT adapter (`adapter_config.json`, "
        "`adapter_model.safetensors`) merged into the model before export; null: the one "
        "sub-folder with an `adapter_config.json`, if there is one. Ignored for Python "
        "uploads.",
    )
    strict: bool | Literal["auto"] = False
    training: TrainingOption = Field(
        default="eval",
        description="A model with layers whose behaviour depends on training mode "
        "(BatchNorm, Dropout, …) left in training mode: `eval` exports it as after "
        "`.eval()`, as torch.onnx.export does, with warning `model_in_training_mode`; "
        "`preserve` exports the training-mode behaviour, with the same warning; `refuse` "
        "fails with `invalid_request`.",
    )
    dynamic_shapes: DynamicShapesSpec | None = None
    auto_fix_dynamic_shapes: bool = True
    decomposition: DecompositionOptions = Field(default_factory=DecompositionOptions)
    weights: WeightsOptions = Field(
        default_factory=WeightsOptions,
        description="How the uploaded weights file is loaded (`report.weights`).",
    )
    device: Literal["cpu", "cuda"] = "cpu"
    verify: VerifyOptions = Field(default_factory=VerifyOptions)
    draft_report: bool = True
    portable: bool = Field(
        default=True,
        description=(
            "Export a wrapper whose inputs and outputs are plain tuples, lists, dicts and "
            "tensors when the model uses container types a torch-only loader cannot rebuild."
        ),
    )
    targets: list[TargetName] = Field(
        default_factory=list,
        description="Deployment artifacts to produce from the exported program, each verified "
        "against eager PyTorch: `onnx` (model.onnx), `aoti` (model.aoti.pt2, AOTInductor), "
        "`executorch` (model.pte, XNNPACK). program.pt2 is always produced.",
    )
    targets_required: bool = Field(
        default=False,
        description="Fail the job (`target_failed`) when a target fails; by default the job "
        "succeeds with the target marked failed and a `target_failed` warning.",
    )
    target_timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] | None = Field(
        default=None,
        description="Seconds each target may take (converting, loading and verifying it); "
        "one over it fails (`target_failed`, `details.reason` `timeout`) and the job keeps "
        "program.pt2 and the other targets. Null: an equal share of what is left of "
        "`timeout_s` among the targets not yet converted. Never more than `timeout_s` leaves.",
    )
    target_range: Literal["declared", "verified"] = Field(
        default="declared",
        description="`declared`: a target whose runtime refuses a verification sample the "
        "program accepts fails (`target_failed`, `details.reason` `runtime_refused`); "
        "`verified`: it is kept for the range it ran, the refused samples skipped "
        "(`partially_verified`) and the range in `details.verified_range`, when every "
        "refused sample lies outside that range (not with `quantize`).",
    )
    aoti: AotiOptions = Field(default_factory=AotiOptions)
    onnx: OnnxOptions = Field(default_factory=OnnxOptions)
    executorch: ExecutorchOptions = Field(default_factory=ExecutorchOptions)
    generation: GenerationOptions = Field(
        default_factory=GenerationOptions,
        description="For a `text-generation` checkpoint: the KV cache and the verification "
        "by generation. Ignored otherwise.",
    )
    quantize: QuantizeOptions = Field(
        default_factory=QuantizeOptions,
        description="Quantize the deployment targets (`report.quantization`: accuracy of each "
        "against the float eager model); program.pt2 stays float.",
    )
    profile: ProfileOptions = Field(
        default_factory=ProfileOptions,
        description="Profiles of every artifact on the worker (`report.profile`); on by "
        "default when targets are asked for.",
    )
    requires: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=64)] = Field(
        default_factory=list,
        description="pip-style requirements the worker must meet before the upload runs, e.g. "
        '"transformers>=4.40"; an unmet one fails the job with `environment_mismatch`.',
    )
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] = 600
    memory_mb: Annotated[int, Field(ge=256, le=1024 * 1024)] | None = Field(
        default=None,
        description="The job's memory limit in MB; null: sized from the upload by the worker "
        "(docs/contract.md §2: 8192, or more for a checkpoint), capped by the worker's "
        "maximum.",
    )

    @field_validator("requires")
    @classmethod
    def _requirements(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                requirement = Requirement(value)
            except InvalidRequirement as exc:
                raise ValueError(f"{value!r} is not a requirement specifier: {exc}") from exc
            if requirement.url is not None:
                raise ValueError(f"{value!r}: requirements name installed packages, not URLs")
        return [value.strip() for value in values]

    @field_validator("adapter")
    @classmethod
    def _relative_folder(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = [part for part in value.replace("\\", "/").split("/") if part not in ("", ".")]
        if value.startswith(("/", "\\")) or not parts or ".." in parts:
            raise ValueError('adapter names a folder inside the zip, e.g. "adapter"')
        return "/".join(parts)

    @field_validator("targets")
    @classmethod
    def _distinct_targets(cls, values: list[str]) -> list[str]:
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            raise ValueError(f"targets are listed more than once: {', '.join(repeated)}")
        return values

    @model_validator(mode="after")
    def _custom_needs_ops(self) -> ExportOptions:
        if self.decomposition.mode != "custom" and self.decomposition.decompose:
            raise ValueError("decomposition.decompose is only used with mode 'custom'")
        return self


CallbackUrl = Annotated[
    str, Field(max_length=CALLBACK_URL_MAX_LENGTH, pattern=CALLBACK_URL_PATTERN)
]
"""Where a job's completion callback is POSTed (docs/contract.md §7)."""


class SubmittedOptions(ExportOptions):
    """The `options` form field of `POST /v1/exports`: the export options, plus the
    deprecated `callback_url`, taken out into the job when it is submitted."""

    callback_url: CallbackUrl | None = Field(
        default=None,
        deprecated="Send the `callback_url` form field instead; this one is still accepted "
        "and moved to the job's `callback_url`.",
        description=(
            "Deprecated: the `callback_url` form field of the job. Service only: on "
            "completion, the job body is POSTed here, signed with HMAC-SHA256 in the "
            "`X-Torchport-Signature` header."
        ),
    )
