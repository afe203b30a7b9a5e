"""`report.profile`: how fast each artifact of a job ran on the worker, and on what.

One list of artifacts (the eager model, `program.pt2`, each succeeded target), each with
its size, load time, resident memory and latency at one thread and at the worker's
threads, so that one table of artifacts renders from it (docs/contract.md §4,
docs/targets.md *Profiles*).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas._base import StrictModel

ProfiledKind = Literal["eager", "program", "target"]
ProfileStatus = Literal["measured", "failed", "skipped"]


class DecodeLatency(StrictModel):
    """One-token decode steps of a generation-ready LLM's artifact at one cache position."""

    position: int = Field(
        description="The step's `cache_position`: the tokens already in the cache before it."
    )
    runs: int = Field(description="Timed steps (at least 1), after one untimed step.")
    p50_ms: float = Field(description="Median latency of a step, in milliseconds: ms/token.")
    mean_ms: float
    min_ms: float
    max_ms: float


class LatencyProfile(StrictModel):
    """Timed runs of one artifact at one thread count."""

    threads: int = Field(description="The thread count the runs were made with.")
    settings: dict[str, int] = Field(
        default_factory=dict,
        description="What each runtime's thread setting was set to, by setting, e.g. "
        '{"torch.set_num_threads": 1, "onnxruntime.intra_op_num_threads": 1}.',
    )
    load_s: float | None = Field(
        default=None,
        description="Seconds to load the artifact for these runs (null for the eager model, "
        "already in memory).",
    )
    warmup: int = Field(
        description="Untimed runs made before the timed ones (fewer than `profile.warmup` "
        "when the budget ran out; the first is always made)."
    )
    runs: int = Field(description="Timed runs made (at least 1).")
    budget_reached: bool = Field(
        description="True when the time budget stopped the runs before `profile.runs`."
    )
    p50_ms: float = Field(description="Median latency of the timed runs, in milliseconds.")
    p90_ms: float = Field(description="90th percentile (nearest rank) of the timed runs, ms.")
    mean_ms: float
    min_ms: float
    max_ms: float
    decode: list[DecodeLatency] = Field(
        default_factory=list,
        description="For a generation-ready LLM's artifacts: one-token decode steps timed "
        "at a short and a long cache position (an eighth and seven eighths of "
        "`max_cache_len`, the short one at most 64); the runs above are then the prefill of "
        "the example's prompt, its time to first token. Where the cache is program state "
        "(eager, `program`, `aoti`, `executorch`) a step writes it at that position; an ONNX "
        "model is fed a past of that many positions as inputs (ONNX Runtime's session "
        "copies the past into its present each step, which ONNX Runtime GenAI's shared "
        "buffer spares). Empty for other artifacts.",
    )


class ArtifactProfile(StrictModel):
    """One artifact's profile: one row of the artifacts table."""

    name: str = Field(
        description="`eager` (the model as uploaded, the reference), `program` (program.pt2) "
        "or a target's name (`onnx`, `aoti`, `executorch`), as `report.targets` keys it."
    )
    kind: ProfiledKind
    status: ProfileStatus = Field(
        default="measured",
        description="`measured`; `failed`: its runtime raised on load or run (`error`); "
        "`skipped`: not loaded, its files would not fit in what was left of the job's memory "
        "limit (`error`).",
    )
    artifact: str | None = Field(
        default=None, description="The file loaded, e.g. `model.onnx`; null for `eager`."
    )
    files: list[str] = Field(
        default_factory=list,
        description="The files counted in `size`: `artifact` and the files it loads beside it "
        "(`model.onnx.data`).",
    )
    size: int | None = Field(
        default=None, description="Bytes on disk of `files`; null for `eager`."
    )
    runtime: str = Field(description="How it was loaded and run, e.g. `onnxruntime 1.32.0 CPU`.")
    load_s: float | None = Field(
        default=None,
        description="Seconds to load it at the worker's threads, as a deployment would "
        "(`torch.export.load(...).module()`, an ONNX Runtime session, …); null for `eager`.",
    )
    peak_rss_mb: float | None = Field(
        default=None,
        description="The most resident memory the job's process held while this artifact was "
        "loaded and run, in MB (everything the process holds counts: see `added_rss_mb`); "
        "null where it cannot be measured.",
    )
    added_rss_mb: float | None = Field(
        default=None,
        description="`peak_rss_mb` less the resident memory just before its first load: what "
        "loading and running it added, in MB.",
    )
    latency: list[LatencyProfile] = Field(
        default_factory=list,
        description="Timed runs at 1 thread, then at the worker's thread count (one entry "
        "when the worker has one thread); empty when `error` is set.",
    )
    error: str | None = Field(
        default=None,
        description="Why it was not measured (`status` `failed` or `skipped`); null when it was.",
    )


class MachineProfile(StrictModel):
    """The worker the profiles were measured on."""

    cpu: str | None = Field(
        default=None, description="The CPU model (`/proc/cpuinfo`); null when unknown."
    )
    architecture: str = Field(description="`platform.machine()`, e.g. `x86_64`, `aarch64`.")
    isa: list[str] = Field(
        default_factory=list,
        description="Vector instruction sets the CPU reports that kernels pick from, e.g. "
        "`avx2`, `fma`, `avx512f`, `avx512_vnni`, `amx_tile`; on Arm `asimd`, `sve`, `i8mm`.",
    )
    torch_capability: str | None = Field(
        default=None,
        description="The CPU capability torch's kernels dispatch to "
        "(`torch.backends.cpu.get_cpu_capability()`, e.g. `AVX2`, `AVX512`).",
    )
    threads: int = Field(
        description="The worker's thread count: the job's torch intra-op threads, the count "
        "the multi-thread runs use."
    )
    cpus: int | None = Field(default=None, description="CPUs the job may run on (its affinity).")
    device: str = Field(default="cpu", description="`cpu`, or `cuda` for a GPU job.")


class ProfileReport(StrictModel):
    """`report.profile` (option `profile`)."""

    machine: MachineProfile
    runs: int = Field(description="Timed runs asked for per artifact and thread count.")
    warmup: int = Field(description="Untimed warm-up runs before them.")
    budget_s: float = Field(
        description="The time the profiles could take, in seconds: `profile.budget_s`, or "
        "less when the job's `timeout_s` leaves less (at most half of what remains)."
    )
    duration_s: float = Field(description="Seconds the profiles took, loads included.")
    artifacts: list[ArtifactProfile] = Field(
        default_factory=list,
        description="`eager`, `program`, then each succeeded target in conversion order.",
    )
