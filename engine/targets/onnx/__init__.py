"""Target `onnx`: `model.onnx` by torch's dynamo-based ONNX exporter, run by ONNX Runtime.

Needs onnx and onnxscript to convert, onnxruntime to run; all imported here only when
called. Nothing is executed besides Python: the converter writes only `path` and, with
external data, `path` + `.data` beside it.

When the program before `run_decompositions` (`undecomposed`) calls `NATIVE_OPS`, that
one is converted, as `torch.onnx.export(module)` itself does: the exporter decomposes it
with its own table, which keeps every op it has an ONNX translation for, so `nn.LSTM` /
`nn.GRU` become ONNX `LSTM` / `GRU` nodes (torch_lib), `nn.RNN` ONNX `RNN` nodes
(`engine.targets.onnx.rnn`) and `scaled_dot_product_attention` ONNX `Attention` from
opset 23, where the core ATen program unrolls every time step and spells attention out
in matmuls. A generation-ready LLM's past/present program is converted undecomposed
too (the exporter's table keeps its linears whole: fewer nodes, and no second
decomposition to wait for). Other programs, and those the exporter fails on
undecomposed, are converted decomposed, as `program.pt2` is.

The model carries the user's names (`engine.targets.onnx.names`, `engine.shapes.dim_names`):
inputs as `forward`'s parameters, outputs as the output structure, dynamic dims as the
dynamic-shapes spec declared them; and in `metadata_props` the torchport version and,
when known, the task.

Beside this module (the target, `engine.targets.interface.Target`): `names` (the inputs',
outputs' and task's names), `native` (the ops kept whole, and the exceptions), `rnn`
(`nn.RNN` as ONNX `RNN`), `metadata` (node metadata removed before saving), `attention`
(an LLM's attention as ONNX Runtime's GroupQueryAttention), `genai` (ONNX Runtime GenAI),
`session` (ONNX Runtime sessions over the written model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.targets.interface import Conversion, TargetJob
from engine.targets.onnx import genai as onnx_genai
from engine.targets.onnx import names as onnx_names
from engine.targets.onnx import native as onnx_native
from engine.targets.onnx import precision as onnx_precision
from engine.targets.onnx import weights as onnx_weights
from engine.targets.onnx.metadata import strip_node_metadata
from engine.targets.registry import spec
from schemas import ExportOptions, VerifyOptions

if TYPE_CHECKING:
    from engine.generation import Encoder
from engine.targets.onnx.genai import runtime_generation
from engine.targets.onnx.native import NATIVE_OPS, RECURRENT_NODES, native_ops
from engine.targets.onnx.precision import PROTOBUF_LIMIT
from engine.targets.onnx.session import THREAD_SETTINGS, load, runtime

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "FLOAT16_TOLERANCE",
    "NATIVE_OPS",
    "PROTOBUF_LIMIT",
    "THREAD_SETTINGS",
    "companions",
    "convert",
    "convert_encoder",
    "load",
    "loading",
    "native_ops",
    "notes",
    "prepare",
    "quantize_artifact",
    "runtime",
    "runtime_generation",
    "tolerances",
]

EXTERNAL_DATA_THRESHOLD = 1_500_000_000
"""With `onnx.external_data: auto`, weights above this many bytes go to `model.onnx.data`."""

FLOAT16_TOLERANCE = (1e-2, 1e-2)
"""(atol, rtol) a float16 model is verified with when verify.atol/rtol are unset."""


def prepare(job: TargetJob) -> Conversion:
    """The program to convert and its settings: the user's names for inputs, outputs and
    dims, the version and task in `metadata_props`, the `onnx` options; the program before
    decomposition as `undecomposed` (its native ops). A generation-ready export converts
    instead the traced model with its KV cache as inputs and outputs
    (`engine.generation.onnx_past`), under optimum's names."""
    from schemas.version import __version__

    metadata = {"torchport.version": __version__}
    task = job.task or onnx_names.task(job.pristine)
    if task is not None:
        metadata["torchport.task"] = task
    options = job.options.onnx
    settings: dict[str, Any] = {
        "input_names": onnx_names.input_names(job.pristine.forward, job.args, job.kwargs),
        "output_names": onnx_names.output_names(job.program.call_spec.out_spec),
        "dim_names": job.names,
        "metadata": metadata,
        "opset": options.opset,
        "dtype": options.dtype,
        "external_data": options.external_data,
        **job.overrides,
    }
    from engine.quantization.onnx_runtime import ACCURACY_LEVELS  # the 4-bit schemes

    if job.quantizing is not None and job.quantizing.scheme in ACCURACY_LEVELS:
        settings["transpose_weights"] = True  # a tied LM head's, quantized too
    if job.generation is None:
        settings["undecomposed"] = job.traced
        return Conversion(job.program, job.args, job.kwargs, settings)
    from engine.targets.onnx import attention

    with_past, settings["attention"] = attention.past_program(job)
    if options.external_data == "auto":  # as the builder writes an LLM; 30 times faster
        settings["external_data"] = True
    metadata["torchport.task"] = with_past.task
    settings.update(
        input_names=with_past.input_names,
        output_names=with_past.output_names,
        dim_names=with_past.dim_names,
        decompose_on_failure=True,
    )
    if job.generation.encoder is None:  # a decoder-only LLM: ONNX Runtime GenAI runs it
        shared = settings["attention"] == attention.NODE  # written in place: one buffer
        artifact = spec("onnx").artifact
        settings["genai"] = onnx_genai.config(job.generation, with_past, artifact, shared)
    return Conversion(with_past.program, (), with_past.kwargs, settings, with_past)


def quantize_artifact(
    path: Path, job: TargetJob, conversion: Conversion, facts: dict[str, Any]
) -> None:
    """Quantize `model.onnx` in place with ONNX Runtime's quantizer (option `quantize`),
    calibrated on the job's calibration inputs (an LLM's: its example past)."""
    from engine.quantization import onnx_runtime
    from engine.targets.failures import TargetError

    quantizing = job.quantizing
    assert quantizing is not None
    with_past = conversion.with_past
    try:
        onnx_runtime.quantize(
            path,
            scheme=quantizing.scheme,
            group_size=quantizing.options.group_size,
            input_names=facts.get("inputs") or [],
            calibration=[((), with_past.kwargs)] if with_past else quantizing.calibration,
            accept=quantizing.accepts_outputs,
            fallbacks=quantizing.fallbacks.setdefault("onnx", []),
        )
    except onnx_runtime.NothingQuantized:
        raise TargetError(
            f"onnx: {quantizing.scheme} found nothing to quantize: the model has no MatMul "
            "or Gemm by a constant 2-D weight",
            hint="ONNX's 4-bit schemes quantize linears only; for convolutions choose "
            "quantize.scheme int8 or int8_dynamic, or leave onnx out of targets.",
            details={"reason": "nothing_quantized", "scheme": quantizing.scheme},
        ) from None


def loading(settings: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """Feed and fetch by the names the model has (a clash may have suffixed one); refuse
    an empty batch when it has recurrent nodes."""
    wanted = settings["output_names"]
    outputs = facts.get("outputs") or []
    return {
        "input_names": facts.get("inputs"),
        "output_names": outputs[len(outputs) - len(wanted) :] if wanted else None,
        "refuse_empty": bool(facts.get("recurrent_nodes")),
    }


def tolerances(options: ExportOptions) -> VerifyOptions:
    """The job's verification options; a float16 model's default to `FLOAT16_TOLERANCE`."""
    opts = options.verify
    if options.onnx.dtype != "float16":
        return opts
    atol, rtol = FLOAT16_TOLERANCE
    return opts.model_copy(
        update={
            "atol": atol if opts.atol is None else opts.atol,
            "rtol": rtol if opts.rtol is None else opts.rtol,
        }
    )


def convert_encoder(
    encoder: Encoder, path: Path, settings: dict[str, Any], facts: dict[str, Any]
) -> tuple[Any, list[Path]]:
    """`encoder.onnx` beside `path`: input named as the encoder's, output
    `last_hidden_state`, the job's opset, dtype and external-data settings."""
    from schemas.version import __version__

    program = encoder.program
    assert program is not None, "the encoder program is made first"
    name = spec("onnx").encoder
    assert name is not None
    written = path.with_name(name)
    own: dict[str, Any] = {}
    convert(
        program,
        (),
        dict(encoder.kwargs),
        written,
        facts=own,
        input_names=[encoder.input_name],
        output_names=["last_hidden_state"],
        dim_names=encoder.names,
        metadata={"torchport.version": __version__, "torchport.task": "encoder"},
        opset=settings.get("opset"),
        dtype=settings.get("dtype", "float32"),
        external_data=settings.get("external_data", "auto"),
    )
    runner = load(
        written, program, input_names=own.get("inputs"), output_names=["last_hidden_state"]
    )
    facts["encoder"] = {key: value for key, value in own.items() if key != "inputs"}
    return runner, [written, *(p for p in companions(written) if p.exists())]


def companions(path: Path) -> list[Path]:
    """The files the model at `path` may have beside it: its external data."""
    return [path.with_name(path.name + ".data")]


def convert(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    *,
    facts: dict[str, Any] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dim_names: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    opset: int | None = None,
    dtype: str = "float32",
    external_data: bool | str = "auto",
    external_threshold: int = EXTERNAL_DATA_THRESHOLD,
    undecomposed: torch.export.ExportedProgram | None = None,
    genai: Mapping[str, Any] | None = None,
    attention: str | None = None,
    decompose_on_failure: bool = False,
    transpose_weights: bool = False,
) -> Path:
    """Write `program` as an ONNX model to `path` (and its weights to `path.data` when
    they are saved as external data).

    Args:
        program: the exported program; its dynamic dims stay dynamic in the model.
        args, kwargs: its example inputs (non-tensor ones are constants of the model).
        path: the file to write.
        facts: filled with `opset`, `inputs` and `outputs` (the ONNX names),
            `input_shapes` and `output_shapes` (dims by name), `dynamic_dims`, `dtype`,
            `external_data`, `initializer_bytes`, `metadata`, `native_ops` (the
            `NATIVE_OPS` kept whole), the `onnx` and `onnxscript` versions.
        input_names: one per graph input (the tensor leaves of the inputs, in order).
        output_names: one per user output (the program's output leaves, in order).
        dim_names: torch's symbol → the user's dim name.
        metadata: written to the model's `metadata_props`.
        opset: the opset to write (None: the exporter's default).
        dtype: `float32`, or `float16` to convert weights and computation (inputs and
            outputs stay float32).
        external_data: `auto` (above `external_threshold` bytes of weights), True, False.
        external_threshold: the `auto` threshold in bytes.
        undecomposed: `program` before `run_decompositions`; converted instead when it
            has `NATIVE_OPS` (the exporter keeps them as single ONNX nodes), and
            `program` only if the exporter fails on it (`facts["native_ops_failed"]`).
        genai: written beside as `genai_config.json` (`engine.targets.onnx.genai`).
        attention: a generation-ready LLM's attention: `attention.NODE`, or why it is
            in standard ops (`facts["attention"]`, `facts["attention_reason"]`).
        decompose_on_failure: `program` is not decomposed (the exporter decomposes it
            with its own table, as `torch.onnx.export(module)` does); if the exporter
            fails on it, its core ATen decomposition is converted
            (`facts["native_ops_failed"]`).
        transpose_weights: a MatMul by a weight's transpose takes the transposed weight
            (`weights.transposed`; for ONNX Runtime's 4-bit quantizer).

    Returns:
        `path`.
    """
    import onnx
    import onnx_ir as ir
    import onnxscript

    from engine.targets import TargetError
    from engine.targets.onnx import attention as onnx_attention
    from engine.targets.onnx import rnn as onnx_rnn

    def export(source: torch.export.ExportedProgram) -> Any:
        return torch.onnx.export(
            onnx_native.without_mistranslated(source),
            tuple(args),
            kwargs=dict(kwargs) or None,
            dynamo=True,
            custom_translation_table=onnx_rnn.TRANSLATIONS | onnx_attention.TRANSLATIONS,
            external_data=False,
            optimize=True,
            opset_version=opset,
            verbose=False,  # else it prints its progress to stdout
        )

    natives = native_ops(undecomposed) if undecomposed is not None else []
    exported, fallback = None, None
    if undecomposed is not None and natives:
        try:
            exported = export(undecomposed)
        except Exception as exc:  # e.g. a view of a kept op's output torch's meta kernel
            # lays out otherwise than eager did: the decomposed program may still convert
            fallback = str(_conversion_error(exc))
            natives = []
    if exported is None:
        try:
            exported = export(program)
        except Exception as exc:
            if not decompose_on_failure:
                raise _conversion_error(exc) from exc
            fallback = str(_conversion_error(exc))  # the core ATen program may still convert
            try:
                exported = export(program.run_decompositions())
            except Exception as again:
                raise _conversion_error(again) from again
    assert exported is not None  # dynamo=True always returns the program
    written = exported.model.opset_imports.get("", None)
    if opset is not None and written != opset:
        raise TargetError(
            f"onnx: the exporter wrote opset {written} where opset {opset} was asked for",
            hint="Ask for another onnx.opset, or leave it unset for the exporter's default.",
            details={"opset": opset, "written": written},
        )
    if dim_names:
        axes: dict[Any, str] = dict(dim_names)
        exported.rename_axes(axes)
    onnx_names.name_values(exported.model, input_names, output_names)
    widened = onnx_precision.widen(exported.model)  # ONNX Runtime's CPU computes float32
    if transpose_weights:
        onnx_weights.transposed(exported.model)
    if dtype == "float16":
        exported.model = onnx_precision.half(exported.model)
    for key, value in (metadata or {}).items():
        exported.model.metadata_props[key] = value
    model = exported.model
    weights = sum(
        value.const_value.nbytes
        for value in model.graph.initializers.values()
        if value.const_value is not None
    )
    external = external_data is True or (external_data == "auto" and weights > external_threshold)
    if not external and weights >= PROTOBUF_LIMIT:
        raise TargetError(
            f"onnx: {weights} bytes of weights do not fit one file (protobuf's 2 GB limit)",
            hint="Set onnx.external_data to auto or true: the weights then go to "
            "model.onnx.data beside model.onnx.",
            details={"initializer_bytes": weights},
        )
    onnx_precision.fits_one_file(weights)
    for stale in companions(path):
        stale.unlink(missing_ok=True)
    strip_node_metadata(model)
    if external:  # tensors under 256 bytes (shapes ONNX Runtime must read) stay inline
        data = companions(path)[0]
        ir.save(model, path, external_data=data.name)
        if data.exists() and data.stat().st_size == 0:  # no tensor went out
            data.unlink()
            external = False
    else:
        ir.save(model, path)
    if genai is not None:
        onnx_genai.write(path, dict(genai))
    if facts is not None:
        if fallback is not None:
            facts["native_ops_failed"] = fallback
        facts.update(onnx_attention.facts(attention))
        facts.update(
            opset=model.opset_imports.get("", None),
            inputs=[value.name for value in model.graph.inputs],
            outputs=[value.name for value in model.graph.outputs],
            input_shapes={value.name: _dims(value) for value in model.graph.inputs},
            output_shapes={value.name: _dims(value) for value in model.graph.outputs},
            dynamic_dims={
                value.name: [
                    index for index, dim in enumerate(value.shape or ()) if not isinstance(dim, int)
                ]
                for value in model.graph.inputs
            },
            dtype=dtype,
            widened_from=widened,
            external_data=external,
            initializer_bytes=weights,
            native_ops=natives,
            recurrent_nodes=sum(node.op_type in RECURRENT_NODES for node in model.graph),
            metadata=dict(model.metadata_props),
            onnx=onnx.__version__,
            onnxscript=onnxscript.__version__,
        )
    return path


def notes(facts: dict[str, Any]) -> list[str]:
    """What a deployment should know."""
    out = [
        "ONNX Runtime does not check the declared dynamic ranges (min/max): inputs outside "
        "them run without an error, where program.pt2 refuses them.",
        f"opset {facts.get('opset')}; inputs {facts.get('inputs')}: the tensor inputs in "
        "order, non-tensor inputs are constants of the model.",
    ]
    if facts.get("external_data"):
        out.append("The weights are in model.onnx.data: keep it beside model.onnx under that name.")
    if facts.get("native_ops_failed"):
        out.append(
            "Converted from the decomposed program (recurrent layers unrolled, attention "
            "as matmuls): the exporter failed on the program with them whole: "
            + str(facts["native_ops_failed"])
        )
    if facts.get("widened_from"):
        out.append(
            f"The model's {facts['widened_from']} weights and computation are float32 in "
            "model.onnx (ONNX Runtime's CPU provider has no reduced-precision kernels for "
            "most ops); verified against eager as a reduced-precision program is."
        )
    if facts.get("dtype") == "float16":
        out.append(
            "float16 weights and computation; inputs and outputs stay float32. Verified "
            "with the float16 tolerances (verify.atol/rtol when set)."
        )
    return out


def _dims(value: Any) -> list[int | str | None]:
    shape = value.shape
    if shape is None:
        return []
    return [dim if isinstance(dim, int) else getattr(dim, "value", None) for dim in shape]


def _conversion_error(exc: BaseException) -> Exception:
    """The exporter's error as a `TargetError` whose message is the cause, not the
    exporter's generic "Failed to convert ... Next steps" preamble."""
    from engine.targets.failures import TargetError, clean

    text = clean(str(exc))
    summary = text.split("## Exception summary", 1)
    if len(summary) == 2:
        lines = [line.strip() for line in summary[1].strip().splitlines()]
        first = next((line for line in lines if line and line != "⬆️"), "")
        # "<class 'torch.onnx._internal.exporter._errors.DispatchError'>: No ONNX function …"
        kind, _, rest = first.partition(">: ")
        name = kind.rsplit(".", 1)[-1].strip("'<> ") if rest else type(exc).__name__
        message = rest or first
    else:
        name, message = type(exc).__name__, (text.strip().splitlines() or [""])[0]
    return TargetError(
        f"onnx: {name}: {message}".rstrip(": "),
        hint=spec("onnx").failure_hint,
        details={"exception": name},
    )
