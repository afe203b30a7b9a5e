"""The Python environment uploads run in: `GET /v1/environment` and `torchport env`."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from schemas._base import StrictModel

MODEL_LIBRARIES: tuple[str, ...] = (
    "torch",
    "torchvision",
    "transformers",
    "diffusers",
    "peft",
    "timm",
    "huggingface-hub",
    "tokenizers",
    "safetensors",
    "numpy",
)
"""Distributions uploads commonly import, listed first (installed or not) and flagged."""


class LibraryInfo(StrictModel):
    """One installed distribution, or a model library that is not installed."""

    name: str = Field(description="The distribution's name as its metadata spells it.")
    version: str | None = Field(default=None, description="null: not installed.")
    model_library: bool = Field(
        default=False, description="One of the model libraries uploads commonly import."
    )
    modules: list[str] = Field(
        default_factory=list, description="Top-level modules it provides (its import names)."
    )
    imports: bool | None = Field(
        default=None,
        description="Whether importing it succeeded in a fresh interpreter like the jobs' "
        "(model libraries only); null: not checked.",
    )
    error: str | None = Field(
        default=None,
        description='Why it does not import, e.g. "RuntimeError: operator '
        'torchvision::nms does not exist"; or "not installed".',
    )


class TargetSupport(StrictModel):
    """Whether a deployment target (option `targets`) can be produced in this environment."""

    name: str = Field(description="`onnx`, `aoti` or `executorch`.")
    works: bool | None = Field(
        default=None,
        description="Its packages (and for `aoti` the C++ compiler) are there and import in a "
        "fresh interpreter like the jobs'; null: found but not checked.",
    )
    missing: list[str] = Field(
        default_factory=list,
        description="What it lacks: modules that are not installed, or the C++ compiler (`g++`).",
    )
    error: str | None = Field(
        default=None, description="Why its packages do not import, when they are installed."
    )


class EnvironmentDescription(StrictModel):
    """The interpreter, torch and every installed distribution an upload can import."""

    python: str
    platform: str
    torchport: str | None = None
    torch: str | None = Field(default=None, description="torch's version; null: not installed.")
    libraries: list[LibraryInfo] = Field(
        default_factory=list,
        description="The model libraries first (in a fixed order), then every other "
        "installed distribution by name.",
    )
    targets: list[TargetSupport] = Field(
        default_factory=list,
        description="Each deployment target and whether it works here; empty in a "
        "description recorded before torchport said so.",
    )
    described_at: datetime
    check_duration_s: float | None = Field(
        default=None, description="How long the import checks took."
    )


class WorkerEnvironment(StrictModel):
    """What a worker recorded about its environment when it started."""

    queue: str
    hostname: str
    recorded_at: datetime
    environment: EnvironmentDescription


class EnvironmentList(StrictModel):
    """`GET /v1/environment`: per queue, the environment its latest worker recorded."""

    workers: list[WorkerEnvironment] = Field(
        default_factory=list,
        description="One per queue, the most recently started worker's; empty until a "
        "worker has started.",
    )
