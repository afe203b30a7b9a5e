"""Target `onnx`: `model.onnx` by torch's dynamo-based ONNX exporter, run by ONNX Runtime.

Needs onnx and onnxscript to convert, onnxruntime to run; all imported here only when
called. Nothing is executed besides Python: the converter writes only `path`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["convert", "load", "notes"]


def convert(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    *,
    facts: dict[str, Any] | None = None,
) -> Path:
    """Write `program` as a single-file ONNX model (weights inside) to `path`.

    Args:
        program: the exported program; its dynamic dims stay dynamic in the model.
        args, kwargs: its example inputs (non-tensor ones are constants of the model).
        path: the file to write.
        facts: filled with `opset`, `inputs` and `outputs` (the ONNX names), `onnx`
            and `onnxscript` versions.

    Returns:
        `path`.
    """
    import onnx
    import onnxscript

    try:
        exported = torch.onnx.export(
            program,
            tuple(args),
            kwargs=dict(kwargs) or None,
            dynamo=True,
            external_data=False,
            optimize=True,
            verbose=False,  # else it prints its progress to stdout
        )
    except Exception as exc:
        raise _conversion_error(exc) from exc
    assert exported is not None  # dynamo=True always returns the program
    exported.save(str(path), external_data=False)
    if facts is not None:
        model = exported.model
        facts.update(
            opset=model.opset_imports.get("", None),
            inputs=[value.name for value in model.graph.inputs],
            outputs=[value.name for value in model.graph.outputs],
            dynamic_dims={
                value.name: [
                    index for index, dim in enumerate(value.shape or ()) if not isinstance(dim, int)
                ]
                for value in model.graph.inputs
            },
            onnx=onnx.__version__,
            onnxscript=onnxscript.__version__,
        )
    return path


def load(path: Path, program: torch.export.ExportedProgram) -> Any:
    """An ONNX Runtime session (CPU provider) over `path`, as a runner of flat outputs.

    The model's inputs are the tensor leaves of `(args, kwargs)` in order (non-tensor
    inputs were baked in as constants).
    """
    import onnxruntime

    session_options = onnxruntime.SessionOptions()
    session_options.log_severity_level = 3  # errors only
    session = onnxruntime.InferenceSession(
        str(path), sess_options=session_options, providers=["CPUExecutionProvider"]
    )
    names = [value.name for value in session.get_inputs()]

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
        return [torch.from_numpy(out) for out in session.run(None, feed)]

    return run


def notes(facts: dict[str, Any]) -> list[str]:
    """What a deployment should know."""
    return [
        "ONNX Runtime does not check the declared dynamic ranges (min/max): inputs outside "
        "them run without an error, where program.pt2 refuses them.",
        f"opset {facts.get('opset')}; inputs {facts.get('inputs')}: the tensor inputs in "
        "order, non-tensor inputs are constants of the model.",
    ]


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
