"""Export options (docs/contract.md §2): every field optional, unknown fields refused."""

from __future__ import annotations

from typing import Annotated, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import Field, field_validator, model_validator

from schemas._base import StrictModel
from schemas.dynamic_shapes import DynamicShapesSpec


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


class VerifyOptions(StrictModel):
    """Comparison of the exported program against eager PyTorch."""

    enabled: bool = True
    atol: Annotated[float | None, Field(ge=0)] = None
    rtol: Annotated[float | None, Field(ge=0)] = None
    samples: Annotated[int, Field(ge=0, le=64)] = 3
    roundtrip: bool = True


class ExportOptions(StrictModel):
    """Everything a user can ask of one export."""

    symbol: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "model"
    entry: str | None = Field(
        default=None, description="The entry file inside a zip upload, e.g. `pkg/net.py`."
    )
    strict: bool | Literal["auto"] = False
    dynamic_shapes: DynamicShapesSpec | None = None
    auto_fix_dynamic_shapes: bool = True
    decomposition: DecompositionOptions = Field(default_factory=DecompositionOptions)
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
    requires: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=64)] = Field(
        default_factory=list,
        description="pip-style requirements the worker must meet before the upload runs, e.g. "
        '"transformers>=4.40"; an unmet one fails the job with `environment_mismatch`.',
    )
    timeout_s: Annotated[float, Field(gt=0, le=24 * 3600)] = 600
    memory_mb: Annotated[int, Field(ge=256, le=1024 * 1024)] = 8192
    callback_url: Annotated[str | None, Field(max_length=2048, pattern=r"^https?://")] = Field(
        default=None,
        description=(
            "Service only: on completion, the job body is POSTed here, signed with "
            "HMAC-SHA256 in the `X-Torchport-Signature` header."
        ),
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

    @model_validator(mode="after")
    def _custom_needs_ops(self) -> ExportOptions:
        if self.decomposition.mode != "custom" and self.decomposition.decompose:
            raise ValueError("decomposition.decompose is only used with mode 'custom'")
        return self
