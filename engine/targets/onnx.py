"""Target `onnx`: `model.onnx` by torch's dynamo-based ONNX exporter, run by ONNX Runtime.

Needs onnx and onnxscript to convert, onnxruntime to run; all imported here only when
called. Nothing is executed besides Python: the converter writes only `path` and, with
external data, `path` + `.data` beside it.

The model carries the user's names (`engine.targets.onnx_names`, `engine.dim_names`):
inputs as `forward`'s parameters, outputs as the output structure, dynamic dims as the
dynamic-shapes spec declared them; and in `metadata_props` the torchport version and,
when known, the task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "PROTOBUF_LIMIT",
    "THREAD_SETTINGS",
    "companions",
    "convert",
    "load",
    "notes",
    "runtime",
]

EXTERNAL_DATA_THRESHOLD = 1_500_000_000
"""With `onnx.external_data: auto`, weights above this many bytes go to `model.onnx.data`."""

PROTOBUF_LIMIT = 2**31
"""protobuf's limit on one serialized message: a single-file model must stay under it."""

THREAD_SETTINGS = ("onnxruntime.intra_op_num_threads",)
"""What `load(threads=...)` sets."""


def runtime() -> str:
    """The runtime `load` runs the model in, with its version."""
    from importlib.metadata import version

    return f"ONNX Runtime {version('onnxruntime')}, CPUExecutionProvider"


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
) -> Path:
    """Write `program` as an ONNX model to `path` (and its weights to `path.data` when
    they are saved as external data).

    Args:
        program: the exported program; its dynamic dims stay dynamic in the model.
        args, kwargs: its example inputs (non-tensor ones are constants of the model).
        path: the file to write.
        facts: filled with `opset`, `inputs` and `outputs` (the ONNX names),
            `input_shapes` and `output_shapes` (dims by name), `dynamic_dims`, `dtype`,
            `external_data`, `initializer_bytes`, `metadata`, the `onnx` and `onnxscript`
            versions.
        input_names: one per graph input (the tensor leaves of the inputs, in order).
        output_names: one per user output (the program's output leaves, in order).
        dim_names: torch's symbol → the user's dim name.
        metadata: written to the model's `metadata_props`.
        opset: the opset to write (None: the exporter's default).
        dtype: `float32`, or `float16` to convert weights and computation (inputs and
            outputs stay float32).
        external_data: `auto` (above `external_threshold` bytes of weights), True, False.
        external_threshold: the `auto` threshold in bytes.

    Returns:
        `path`.
    """
    import onnx
    import onnxscript

    from engine.targets import TargetError

    try:
        exported = torch.onnx.export(
            program,
            tuple(args),
            kwargs=dict(kwargs) or None,
            dynamo=True,
            external_data=False,
            optimize=True,
            opset_version=opset,
            verbose=False,  # else it prints its progress to stdout
        )
    except Exception as exc:
        raise _conversion_error(exc) from exc
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
    _name_values(exported.model, input_names, output_names)
    if dtype == "float16":
        exported.model = _half(exported.model)
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
    for stale in companions(path):
        stale.unlink(missing_ok=True)
    exported.save(str(path), external_data=external)
    if facts is not None:
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
            external_data=external,
            initializer_bytes=weights,
            metadata=dict(model.metadata_props),
            onnx=onnx.__version__,
            onnxscript=onnxscript.__version__,
        )
    return path


def load(
    path: Path,
    program: torch.export.ExportedProgram,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    threads: int | None = None,
) -> Any:
    """An ONNX Runtime session (CPU provider) over `path`, as a runner of flat outputs.

    The model's inputs are the tensor leaves of `(args, kwargs)` in order (non-tensor
    inputs were baked in as constants), fed by name: `input_names` when given (the
    session refuses a name the model does not have), else the model's own. With
    `output_names`, those outputs are fetched by name. `threads` sets the session's
    intra-op thread pool (`THREAD_SETTINGS`); None leaves ONNX Runtime's default (one
    thread per physical core).
    """
    import onnxruntime

    session_options = onnxruntime.SessionOptions()
    session_options.log_severity_level = 3  # errors only
    if threads is not None:
        session_options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(
        str(path), sess_options=session_options, providers=["CPUExecutionProvider"]
    )
    names = list(input_names or [value.name for value in session.get_inputs()])
    fetch = list(output_names) if output_names else None

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        tensors = [
            leaf
            for leaf in pytree.tree_leaves((tuple(args), dict(kwargs)))
            if isinstance(leaf, torch.Tensor)
        ]
        if len(tensors) != len(names):
            raise RuntimeError(
                f"model.onnx takes {len(names)} inputs, the call has {len(tensors)} tensors"
            )
        feed = {name: _numpy(t) for name, t in zip(names, tensors, strict=True)}
        return [torch.from_numpy(out) for out in session.run(fetch, feed)]

    return run


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


def _name_values(
    model: Any, input_names: Sequence[str] | None, output_names: Sequence[str] | None
) -> None:
    """Give the graph's inputs and its last outputs (the user's: mutated buffers come
    first) the names asked for. An intermediate value holding a name is renamed; an
    output name an input or initializer already has gets `.output` appended; an output
    that is also an input, or listed twice, is given an Identity of its own."""
    import onnx_ir as ir

    graph = model.graph
    values = {
        id(v): v
        for v in [*graph.inputs, *graph.outputs]
        + [out for node in ir.traversal.RecursiveGraphIterator(graph) for out in node.outputs]
    }
    reserved = set(graph.initializers)
    inputs = list(graph.inputs)
    if input_names is not None and len(input_names) == len(inputs):
        for value, name in zip(inputs, input_names, strict=True):
            _claim(values.values(), reserved, value, name)
    outputs = list(graph.outputs)
    if not output_names or len(output_names) > len(outputs):
        return
    first = len(outputs) - len(output_names)
    seen: set[int] = set()
    for index, name in enumerate(output_names, start=first):
        value = outputs[index]
        if value.is_graph_input() or id(value) in seen or value.name in graph.initializers:
            node = ir.Node("", "Identity", inputs=[value], num_outputs=1)
            graph.append(node)
            copy = node.outputs[0]
            copy.shape, copy.type = value.shape, value.type
            graph.outputs[index] = copy
            values[id(copy)] = copy
            value = copy
        seen.add(id(value))
        _claim(values.values(), reserved, value, name)


def _claim(values: Any, reserved: set[str], value: Any, name: str) -> None:
    """Name `value` `name` (or `name.output` when an input, initializer or earlier
    output has it); any other value of that name is renamed out of the way."""
    while name in reserved:
        name = f"{name}.output"
    for other in values:
        if other is not value and other.name == name:
            other.name = f"{name}.{id(other):x}"
    value.name = name
    reserved.add(name)


def _half(model: Any) -> Any:
    """The model with float32 weights and computation in float16 (ONNX Runtime's
    converter, as optimum uses it); inputs and outputs stay float32."""
    import onnx_ir as ir
    from onnxruntime.transformers.float16 import convert_float_to_float16

    large = (
        sum(
            v.const_value.nbytes
            for v in model.graph.initializers.values()
            if v.const_value is not None
        )
        >= PROTOBUF_LIMIT
    )
    proto = convert_float_to_float16(
        ir.to_proto(model), keep_io_types=True, disable_shape_infer=large
    )
    return ir.from_proto(proto)


def _conversion_error(exc: BaseException) -> Exception:
    """The exporter's error as a `TargetError` whose message is the cause, not the
    exporter's generic "Failed to convert ... Next steps" preamble."""
    from engine.targets import _HINTS, TargetError, clean

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
        hint=_HINTS["onnx"],
        details={"exception": name},
    )


def _numpy(tensor: torch.Tensor) -> Any:
    return tensor.detach().cpu().contiguous().numpy()
