"""What a deployment target's module implements (`Target`), what it is given for one
job (`TargetJob`), and what it prepares to convert (`Conversion`).

`engine.targets.run.run_target` drives every target the same way: `prepare` (the program
to convert and the converter's settings), `convert`, `quantize_artifact` when the job
quantizes and the target quantizes its artifact rather than its program, `loading` and
`load`, `convert_encoder` for an encoder-decoder model, verification with `tolerances`,
the generation check, and `notes`. A target's facts that code outside its module needs
(files, packages, hints, schemes, toolchain programs) are its row in
`engine.targets.registry`.

Torch-free at import: torch's types are named for the type checker only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from engine.generation import Encoder, Generation
    from engine.generation.onnx_past import PastProgram
    from engine.profile.profiling import Subject
    from engine.quantization import Quantizing
    from schemas import ExportOptions, VerifyOptions

__all__ = ["Conversion", "FlatRunner", "Target", "TargetJob", "structured_runner"]

FlatRunner = Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]]
"""Runs a loaded artifact on `(args, kwargs)` and returns its outputs as a flat list."""


@dataclass
class TargetJob:
    """Everything a target is converted and verified from: the job's programs, its
    eager model and example inputs, its options, and what the pipeline wants back."""

    program: torch.export.ExportedProgram
    """The final program (the one saved as program.pt2)."""
    traced: torch.export.ExportedProgram
    """The program before `run_decompositions` (ExecuTorch lowers from it; ONNX converts
    it when it calls ops ONNX runs natively)."""
    pristine: torch.nn.Module
    """The eager module, never run itself (verification deep-copies it)."""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    """The example inputs the program was exported with."""
    out_dir: Path
    """Where the artifact is written, under its registry name."""
    options: ExportOptions
    names: Mapping[str, str] | None = None
    """The user's dim names for torch's symbols (`engine.shapes.dim_names`): the ONNX
    model's dynamic dims carry them."""
    task: str | None = None
    """The task the loader chose for a checkpoint (`report.checkpoint.task`), written
    into the ONNX model's metadata; None: read from the model's class."""
    generation: Generation | None = None
    """A generation-ready export: verified by a greedy-generation check (and, for onnx,
    converted with its KV cache as inputs and outputs)."""
    progress: Callable[[str], None] | None = None
    """Told `"loading"` and `"verifying"` as the target reaches them."""
    profiled: dict[str, Subject] | None = None
    """When given, a succeeded target adds itself, loaded as it was verified."""
    quantizing: Quantizing | None = None
    """Option `quantize`: the artifact is quantized and its accuracy measured."""
    budget_s: float | None = None
    """The seconds it may take, all of it (`engine.targets.time_budget.limit`)."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Converter settings that replace the ones `prepare` chose (tests: a small
    `external_threshold` for ONNX's external data)."""


@dataclass
class Conversion:
    """What `Target.prepare` chose: the program to convert, its inputs, the converter's
    keyword settings, and for an ONNX LLM the traced program with its cache as inputs."""

    source: torch.export.ExportedProgram
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    settings: dict[str, Any]
    with_past: PastProgram | None = None


@runtime_checkable
class Target(Protocol):
    """A target's module. Third-party packages are imported inside the functions only.
    An optional `bound(message) -> dict | None` parses a runtime's refusal into the bound
    it met (`engine.targets.failures.refusal`); an optional `quantize_artifact(path, job,
    conversion, facts)` quantizes the converted artifact (else the job's quantized program
    is converted); an optional `runtime_generation(path, generation, settings, notes)`
    runs the generation check again in the runtime's own generation loop (or returns
    None)."""

    THREAD_SETTINGS: tuple[str, ...]
    """What `load(threads=...)` sets besides torch's own thread count."""

    def runtime(self) -> str:
        """The runtime `load` runs the artifact in, with its version."""
        ...

    def prepare(self, job: TargetJob) -> Conversion:
        """The program to convert and the converter's settings for `job`."""
        ...

    def convert(
        self,
        program: torch.export.ExportedProgram,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        path: Path,
        **settings: Any,
    ) -> Path:
        """Write the artifact to `path` (`facts`: a dict filled with what the converter
        found, for the report's `details`)."""
        ...

    def loading(self, settings: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments `load` takes for an artifact converted with `settings`."""
        ...

    def load(self, path: Path, program: torch.export.ExportedProgram, **loading: Any) -> Any:
        """The artifact at `path` loaded in its runtime, as a `FlatRunner`."""
        ...

    def tolerances(self, options: ExportOptions) -> VerifyOptions:
        """The verification options its runtime is held to."""
        ...

    def convert_encoder(
        self,
        encoder: Encoder,
        path: Path,
        settings: dict[str, Any],
        facts: dict[str, Any],
    ) -> tuple[Any, list[Path]]:
        """Convert an encoder-decoder model's encoder beside the artifact at `path`, load
        it, and return its flat runner and the files written."""
        ...

    def notes(self, facts: dict[str, Any]) -> list[str]:
        """What a deployment should know, from the converter's `facts`."""
        ...


def structured_runner(flat: FlatRunner, program: torch.export.ExportedProgram) -> Any:
    """A runner returning outputs in the program's own structure (its `out_spec`), so
    the verification table names them as it names the program's outputs."""
    import torch.utils._pytree as pytree

    out_spec = program.call_spec.out_spec
    count = out_spec.num_leaves if out_spec is not None else None

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        leaves = list(flat(args, kwargs))
        if out_spec is None or count is None:
            return leaves
        if len(leaves) > count:
            # A runtime that also returns the mutated buffers puts them first, as the
            # program's own output list does.
            leaves = leaves[len(leaves) - count :]
        if len(leaves) != count:
            raise RuntimeError(f"the artifact returned {len(leaves)} outputs, the program {count}")
        return pytree.tree_unflatten(leaves, out_spec)

    return run
