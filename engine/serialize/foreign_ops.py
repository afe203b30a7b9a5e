"""Operators of a program that a process which imported only torch cannot resolve.

`torch.export.save` writes each operator by its name (`transformers::grouped_mm_fallback`),
and `torch.export.load` looks the name up in the loading process. A custom operator that a
library (or the upload itself) registers when it is imported saves fine and then fails
every torch-only load, late and with a message about the loader. `check_ops` names such
operators before the program is saved (error `non_portable_op`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.diagnostics.source_map import SourceMap
from engine.errors import NonPortableOp
from schemas import SourceLocation

__all__ = ["TORCH_NAMESPACES", "ForeignOp", "check_ops", "foreign_ops"]

TORCH_NAMESPACES = frozenset(
    {
        "_c10d_functional",
        "_c10d_functional_autograd",
        "_dtensor",
        "_native",
        "_quantized",
        "_test",
        "aten",
        "c10d",
        "debug_mode_ops",
        "debugprims",
        "export",
        "inductor",
        "inductor_prims",
        "mkl",
        "mkldnn",
        "mkldnn_prepacked",
        "onednn",
        "prims",
        "profiler",
        "quantization",
        "quantized",
        "rngprims",
        "sparse",
        "static_runtime",
        "symm_mem",
    }
)
"""The operator namespaces a bare `import torch` registers (torch 2.13, measured with
`torch._C._dispatch_get_all_op_names()` in `python -I -c "import torch"`; the test
`test_torch_namespaces_are_those_of_a_bare_import` keeps it current)."""


@dataclass(frozen=True)
class ForeignOp:
    """One operator outside torch's namespaces, and who registered it."""

    op: str
    """As the report writes ops: `transformers.grouped_mm_fallback.default`."""
    namespace: str
    library: str
    """The top-level package of the Python module that defined it (`transformers`),
    `upload` when the upload's own code did, else the namespace."""
    count: int
    location: SourceLocation | None = None
    """Where the upload defined it."""

    def as_details(self) -> dict[str, object]:
        """The form `non_portable_op` lists it in."""
        return {
            "op": self.op,
            "namespace": self.namespace,
            "library": self.library,
            "count": self.count,
        }


def _origin(op: torch._ops.OpOverload, source_map: SourceMap) -> tuple[str, SourceLocation | None]:
    """Who defined `op`, from the function of a `torch.library.custom_op`; else its
    namespace (ops defined with `torch.library.Library` or in C++ do not record it)."""
    from torch._library.custom_ops import OPDEFS

    function = getattr(OPDEFS.get(op._schema.name), "_init_fn", None)
    code = getattr(function, "__code__", None)
    if code is not None:
        location = source_map.location(code.co_filename, code.co_firstlineno)
        if location is not None:
            return "upload", location
    module = getattr(function, "__module__", None)
    if isinstance(module, str) and module:
        return module.partition(".")[0], None
    return op.namespace, None


def foreign_ops(ep: torch.export.ExportedProgram, source_map: SourceMap) -> list[ForeignOp]:
    """The operators of `ep` (and of its subgraphs) outside `TORCH_NAMESPACES`, by name."""
    counts: dict[str, int] = {}
    found: dict[str, torch._ops.OpOverload] = {}
    for module in ep.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
                continue
            if target.namespace in TORCH_NAMESPACES:
                continue
            name = str(target)
            counts[name] = counts.get(name, 0) + 1
            found[name] = target
    ops = []
    for name, op in sorted(found.items()):
        library, location = _origin(op, source_map)
        ops.append(ForeignOp(name, op.namespace, library, counts[name], location))
    return ops


def check_ops(ep: torch.export.ExportedProgram, source_map: SourceMap) -> None:
    """Raise `non_portable_op` when `ep` calls operators a torch-only loader lacks.

    Raises:
        NonPortableOp: naming each operator and the library that registers it.
    """
    found = foreign_ops(ep, source_map)
    if not found:
        return
    libraries = sorted({f.library for f in found})
    who = " and ".join("the uploaded code" if lib == "upload" else lib for lib in libraries)
    names = ", ".join(f"`{f.op}`" for f in found)
    which = "it" if len(found) == 1 else "them"
    raise NonPortableOp(
        f"The program calls {names}, registered by {who} when imported: "
        f"`torch.export.load` in a process that imported only torch cannot resolve {which}.",
        hint=f"Replace {names} with torch operations in the model, or register a "
        f"CompositeImplicitAutograd kernel for {which} so that decomposition turns {which} "
        f"into ATen ops. To keep {which}, set `portable: false` and `verify.roundtrip: "
        f"false`: the program then loads only where {who} is imported first.",
        location=next((f.location for f in found if f.location is not None), None),
        details={"ops": [f.as_details() for f in found], "libraries": libraries},
    )
