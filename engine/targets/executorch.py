"""Target `executorch`: `model.pte`, lowered with the XNNPACK partitioner, run by the
ExecuTorch runtime's Python bindings.

Lowers the program *before* `run_decompositions`: XNNPACK delegates more of it that way
(linear stays linear instead of becoming addmm and permutes). Needs executorch 1.4.1 (the
release built against torch 2.13) and torchao, installed without their dependencies (see
README), imported here only when called.

What runs and what is written (for a sandbox profile): the `flatc` binary executorch
ships (`executorch/data/bin/flatc`; `$FLATC_EXECUTABLE` or `flatc` on PATH when the
package has none), reading and writing temporary schema and JSON files in `$TMPDIR`;
then `path`. Loading and running execute nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

__all__ = ["THREAD_SETTINGS", "convert", "load", "notes", "runtime"]

THREAD_SETTINGS = ("executorch.threadpool",)
"""What `load(threads=...)` sets: the process's one ExecuTorch thread pool (XNNPACK's)."""


def runtime() -> str:
    """The runtime `load` runs the program in, with its version."""
    from importlib.metadata import version

    return f"ExecuTorch {version('executorch')} runtime, XNNPACK delegate"


_DELEGATE = "executorch_call_delegate"


def convert(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    *,
    facts: dict[str, Any] | None = None,
    constant_methods: dict[str, Any] | None = None,
    method: str = "forward",
    extra_methods: Mapping[str, torch.export.ExportedProgram] | None = None,
) -> Path:
    """Lower `program` to ExecuTorch with XNNPACK and write the `.pte` to `path`.

    Args:
        program: the exported program before `run_decompositions`.
        args, kwargs: its example inputs (unused: the program carries its own).
        path: the file to write.
        facts: filled with `delegated` (nodes handed to XNNPACK), `portable_ops` (ops
            left to ExecuTorch's portable kernels, with counts), `executorch` (version),
            `constant_methods` and, with several methods, `methods`.
        constant_methods: methods of the program that return a constant (an LLM's
            `get_max_seq_len`, `use_kv_cache`, …, which ExecuTorch's LLM runner reads).
        method: the name of `program`'s method in the `.pte`.
        extra_methods: more programs, each a method of the same `.pte` (an
            encoder-decoder model's `encoder` beside its `text_decoder`, as ExecuTorch's
            ASR runner and optimum-executorch name them).

    Returns:
        `path`.
    """
    programs = {method: program, **(extra_methods or {})}
    unbounded = [
        f"{name}: {dim}" if len(programs) > 1 else dim
        for name, each in programs.items()
        for dim in _unbounded_dims(each)
    ]
    if unbounded:
        from engine.targets import TargetError

        raise TargetError(
            "executorch: dynamic dims without an upper bound: "
            + ", ".join(unbounded)
            + " (the runtime plans memory for each dim's maximum)",
            hint="Give these dims a max in dynamic_shapes (e.g. Dim(..., max=512)), or leave "
            "executorch out of targets.",
            details={"unbounded": unbounded},
        )
    with _quiet_torchao():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.exir import to_edge_transform_and_lower
        from executorch.version import __version__

    edge = to_edge_transform_and_lower(
        programs if len(programs) > 1 else program,
        partitioner=[XnnpackPartitioner()],
        constant_methods=constant_methods,
    )
    if facts is not None:
        delegated, portable = 0, dict[str, int]()
        for name in programs:
            counted, left = _partition(edge.exported_program(name))
            delegated += counted
            for op, count in left.items():
                portable[op] = portable.get(op, 0) + count
        facts.update(delegated=delegated, portable_ops=portable, executorch=__version__)
        if len(programs) > 1:
            facts["methods"] = list(programs)
        if constant_methods:
            facts["constant_methods"] = dict(constant_methods)
    lowered = edge.to_executorch()
    with path.open("wb") as handle:
        lowered.write_to_file(handle)
    return path


def load(
    path: Path,
    program: torch.export.ExportedProgram,
    *,
    method: str = "forward",
    threads: int | None = None,
) -> Any:
    """The `.pte` at `path` in the ExecuTorch runtime, as a runner of flat outputs of
    its `method`.

    The method takes the leaves of `(args, kwargs)` in order (non-tensor ones too).
    Outputs are copied: the runtime reuses its planned memory on the next run. `threads`
    resizes ExecuTorch's thread pool first: one per process, shared by every loaded
    program (None leaves it as it is: by default one thread per performance core).
    """
    from executorch.runtime import Runtime

    if threads is not None:
        from executorch.extension.pybindings import portable_lib

        if portable_lib._threadpool_get_thread_count() != threads:
            portable_lib._unsafe_reset_threadpool(threads)

    loaded = Runtime.get().load_program(str(path)).load_method(method)

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        leaves = [
            leaf.detach().contiguous() if isinstance(leaf, torch.Tensor) else leaf
            for leaf in pytree.tree_leaves((tuple(args), dict(kwargs)))
        ]
        outputs = loaded.execute(leaves)
        return [out.clone() if isinstance(out, torch.Tensor) else out for out in outputs]

    return run


def notes(facts: dict[str, Any]) -> list[str]:
    """What a deployment should know."""
    found = [
        "Dynamic dims run only up to their declared max (the runtime plans memory for "
        "it and refuses larger inputs); the inputs are the leaves of (args, kwargs) in order.",
        f"XNNPACK runs {facts.get('delegated', 0)} delegated subgraph(s)",
    ]
    portable = facts.get("portable_ops") or {}
    if portable:
        found[-1] += "; ExecuTorch's portable kernels run " + ", ".join(sorted(portable)) + "."
    else:
        found[-1] += "; no op is left to the portable kernels."
    return found


def _unbounded_dims(program: torch.export.ExportedProgram) -> list[str]:
    """The user inputs' dims (`x dim 0`) whose symbol has no finite upper bound."""
    user_inputs = set(program.graph_signature.user_inputs)
    found: list[str] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for index, dim in enumerate(value.shape):
            if not isinstance(dim, torch.SymInt):
                continue
            for symbol in dim.node.expr.free_symbols:
                bound = program.range_constraints.get(symbol)
                # torch's int_oo is a sympy number whose is_finite is True.
                if bound is None or not isinstance(bound.upper, sympy.Integer):
                    found.append(f"{node.name} dim {index}")
                    break
    return found


def _partition(program: torch.export.ExportedProgram) -> tuple[int, dict[str, int]]:
    delegated, portable = 0, dict[str, int]()
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if _DELEGATE in name:
            delegated += 1
        elif name != "getitem":
            portable[name] = portable.get(name, 0) + 1
    return delegated, portable


@contextmanager
def _quiet_torchao() -> Iterator[None]:
    """torchao logs a warning per CUDA library it cannot load on a CPU-only machine."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
