"""An encoder-decoder model's second program: its encoder (`encoder.pt2`).

The job's program is the decoder with its static cache (`engine.generation.seq2seq`);
the encoder goes through the same steps beside it, with the same code: traced by
`engine.trace.tracing` (strict, on its own example and dims), decomposed as the options say,
verified against the eager encoder on the example and on samples of
`encoder_sequence_length`, saved, and loaded back in a fresh torch-only process by the
job's round-trip runner. Its report is `report.generation.encoder`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.decompose import decomposition
from engine.errors import SerializationFailed, VerificationFailed
from engine.generation import Encoder
from engine.load.model import LoadedModel
from engine.pipeline.run_state import ExportRun
from engine.serialize import roundtrip
from engine.serialize.artifacts import ENCODER
from engine.shapes.dim_names import dim_names
from engine.trace import tracing
from engine.verify import verification
from schemas import EncoderReport, ExportOptions, VerificationReport

if TYPE_CHECKING:
    from engine.pipeline.request import RoundtripRunner

__all__ = ["ENCODER_PROGRAM", "failed", "make", "save", "verify"]

ENCODER_PROGRAM = ENCODER


def make(run: ExportRun, loaded: LoadedModel, encoder: Encoder) -> EncoderReport:
    """Trace and decompose the encoder (`encoder.traced`, `encoder.program`)."""
    options = run.request.options
    if options.device == "cuda":
        encoder.module.to("cuda")
        encoder.kwargs = {k: v.to("cuda") for k, v in encoder.kwargs.items()}
    source = LoadedModel(
        module=encoder.module,
        args=(),
        kwargs=dict(encoder.kwargs),
        source_map=loaded.source_map,
        entry=loaded.entry,
        module_name=type(encoder.module).__module__,
        module_dynamic_shapes=encoder.dynamic_shapes,
        dynamic_shapes_source="checkpoint",
        device=options.device,
        strict=True,
    )
    spec = encoder.dynamic_shapes
    traced = tracing.trace(source, options, spec, "checkpoint" if spec else "none")
    run.warnings.extend(traced.warnings)
    decomposed = decomposition.decompose(
        traced.ep, options.decomposition, source_map=loaded.source_map
    )
    run.warnings.extend(decomposed.warnings)
    encoder.traced, encoder.program = traced.ep, decomposed.ep
    encoder.names = dim_names(
        decomposed.ep, traced.dynamic_shapes, encoder.module, (), encoder.kwargs
    )
    value = encoder.kwargs[encoder.input_name]
    shape: list[int | str] = list(value.shape)
    for index, size in enumerate(_input_sizes(decomposed.ep)):
        if isinstance(size, torch.SymInt) and index < len(shape):
            shape[index] = encoder.names.get(str(size.node.expr), str(size.node.expr))
    return EncoderReport(inputs=[encoder.input_name], input_shape=shape)


def verify(encoder: Encoder, options: ExportOptions) -> VerificationReport:
    """The encoder program against the eager encoder (example and samples)."""
    assert encoder.program is not None, "make() first"
    return verification.verify(
        encoder.program,
        encoder.module,
        (),
        dict(encoder.kwargs),
        options.verify,
        names=encoder.names,
    )


def failed(checked: VerificationReport) -> VerificationFailed:
    """`verification_failed` for an encoder that does not match (`details.program`)."""
    first = next((s for s in checked.samples if s.status == "failed"), None)
    return VerificationFailed(
        "The exported encoder does not match the eager encoder"
        + (f" on sample {first.label!r}" if first is not None else "")
        + " (report.generation.encoder.verification has every sample).",
        hint="Look at report.generation.encoder.verification; raise verify.atol/rtol if "
        "the difference is numerical noise of a long sequence.",
        details={
            "program": ENCODER_PROGRAM,
            "sample": first.label if first is not None else None,
            "symbols": dict(first.symbols) if first is not None else {},
        },
    )


def save(
    run: ExportRun,
    encoder: Encoder,
    report: EncoderReport,
    runner: RoundtripRunner | None,
) -> Path:
    """Write `encoder.pt2`; with a `runner`, load it back in a fresh process.

    Raises:
        ExportError: `serialization_failed` (`details.program = "encoder.pt2"`).
    """
    assert encoder.program is not None, "make() first"
    path = run.request.out_dir / ENCODER_PROGRAM
    try:
        torch.export.save(encoder.program, path)
    except Exception as exc:
        raise SerializationFailed(
            f"torch.export.save failed for the encoder: {type(exc).__name__}: {exc}",
            details={"exception": type(exc).__name__, "program": ENCODER_PROGRAM},
        ) from exc
    if runner is None:
        return path
    payload = run.request.work_dir / "roundtrip-encoder-payload.pt"
    kwargs = dict(encoder.kwargs)
    with torch.no_grad():
        expected = encoder.program.module()(**copy.deepcopy(kwargs))
    roundtrip.write_payload(payload, (), kwargs, expected)
    check = runner(path, payload)
    report.roundtrip = check
    if check.status == "failed":
        raise SerializationFailed(
            "The saved encoder.pt2 did not load and run the same in a fresh process: "
            + (check.reason or "outputs differ"),
            hint="A deployment loading this file would fail the same way; report the model type.",
            details={
                "bitwise_equal": check.bitwise_equal,
                "reason": check.reason,
                "program": ENCODER_PROGRAM,
            },
        )
    return path


def _input_sizes(program: torch.export.ExportedProgram) -> list[object]:
    user = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                return list(value.shape)
    return []
