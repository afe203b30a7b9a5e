"""ONNX Runtime sessions over a written `model.onnx`: the target's `load`, `runtime` and
thread settings (`engine.targets.interface.Target`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.targets.onnx.native import EMPTY_REFUSED

__all__ = ["THREAD_SETTINGS", "load", "runtime"]

THREAD_SETTINGS = ("onnxruntime.intra_op_num_threads",)
"""What `load(threads=...)` sets."""


def runtime() -> str:
    """The runtime `load` runs the model in, with its version."""
    from importlib.metadata import version

    return f"ONNX Runtime {version('onnxruntime')}, CPUExecutionProvider"


def load(
    path: Path,
    program: torch.export.ExportedProgram,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    threads: int | None = None,
    refuse_empty: bool = False,
) -> Any:
    """An ONNX Runtime session (CPU provider) over `path`, as a runner of flat outputs.

    The model's inputs are the tensor leaves of `(args, kwargs)` in order (non-tensor
    inputs were baked in as constants), fed by name: `input_names` when given (the
    session refuses a name the model does not have), else the model's own. With
    `output_names`, those outputs are fetched by name. `threads` sets the session's
    intra-op thread pool (`THREAD_SETTINGS`); None leaves ONNX Runtime's default (one
    thread per physical core). `refuse_empty` (a model with `RECURRENT_NODES`): a call
    with an empty input raises instead of running, as ONNX Runtime 1.32 aborts the whole
    process (`terminate called without an active exception`) on an empty batch there.
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
    wide = {value.name for value in session.get_inputs() if value.type == "tensor(float)"}
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
        if refuse_empty and any(t.numel() == 0 for t in tensors):
            raise RuntimeError(EMPTY_REFUSED)
        feed = {name: _numpy(t, name in wide) for name, t in zip(names, tensors, strict=True)}
        return [torch.from_numpy(out) for out in session.run(fetch, feed)]

    return run


def _numpy(tensor: torch.Tensor, wide: bool = False) -> Any:
    """`tensor` as numpy; `wide`: as float32 where it is floating (a widened model's
    input, `precision.widen`; numpy has no bfloat16)."""
    tensor = tensor.detach().cpu()
    if wide and tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.contiguous().numpy()
