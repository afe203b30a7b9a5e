"""The DECOMPOSE stage: `run_decompositions` with the table the options ask for.

Modes (docs/contract.md §2): `core_aten` decomposes with `torch.export.default_decompositions()`
minus the ops in `preserve`; `none` returns the program as `torch.export.export` made
it; `custom` decomposes only the ops in `decompose`. `core_aten` and `custom` both give
the functional (inference) IR, where buffer mutations are explicit graph outputs.

When `run_decompositions` fails and `keep_failing_ops` is on, the stage looks for the
fewest ops to keep undecomposed that let it pass. The same search runs (from the
pipeline, `keep_until_verified`) when the decomposed program fails verification while
the program before decomposition passes. Only ops that have an entry in the
table can be kept (composite ops and ops with a Python decomposition); the search tries
the op of the node torch names in its error first, then all candidates, then shrinks
the kept set by delta debugging to a set from which no op can be dropped.

What counts as "outside the core ATen set" (`non_core_aten_ops`): an ATen overload whose
tags lack `torch.Tag.core` (e.g. `aten.conv2d.default`, whose core form is
`aten.convolution.default`), and every custom op (any namespace but `aten`). Not listed:
higher-order ops (`cond`, `map`, `while_loop`: control flow of the export IR, with their
bodies counted op by op), Python builtins on symbolic values (`operator.getitem`,
`operator.mul`, ...), and the runtime assertions export itself inserts
(`aten._assert_scalar`, `aten.sym_constrain_range_for_size`, ...), which every backend
of the export IR must accept anyway.
"""

from __future__ import annotations

import copy
import re
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from engine.decompose import recurrent
from engine.decompose.shrink import shrink
from engine.diagnostics.source_map import SourceMap
from engine.errors import DecompositionFailed, InvalidRequest
from engine.trace.graph_ops import op_histogram, subgraphs, target_name
from schemas import DecompositionOptions, DecompositionReport, ReportWarning, SourceLocation

Table = dict[Any, Callable[..., Any]]

_EXPORT_ASSERTIONS = frozenset(
    {
        "aten._assert_scalar.default",
        "aten._assert_tensor_metadata.default",
        "aten._assert_async.default",
        "aten._assert_async.msg",
        "aten.sym_constrain_range.default",
        "aten.sym_constrain_range_for_size.default",
    }
)
"""Runtime checks export adds for symbolic shapes; not compute, so not reported as non-core."""

_WHILE_EXECUTING = re.compile(r"While executing %(?P<node>[A-Za-z_][A-Za-z0-9_]*)")
"""How torch's FX interpreter names the node it was running when an error escaped."""


@dataclass
class Decomposed:
    """The decomposed program, what changed, and what the user should know."""

    ep: ExportedProgram
    report: DecompositionReport
    warnings: list[ReportWarning] = field(default_factory=list)


def decompose(
    ep: ExportedProgram,
    opts: DecompositionOptions,
    *,
    source_map: SourceMap | None = None,
) -> Decomposed:
    """Decompose `ep` as the options say.

    Args:
        ep: the traced program; it is not modified.
        opts: mode, ops to preserve or to decompose, whether to keep failing ops.
        source_map: when given, a failure points at the user's line of the failing node.

    Raises:
        InvalidRequest: an op name in `preserve` or `decompose` is not a torch operator.
        DecompositionFailed: `run_decompositions` failed and no set of kept ops fixes it
            (or `keep_failing_ops` is off).
    """
    for name in [*opts.preserve, *opts.decompose]:
        resolve_op(name)  # a wrong name is an InvalidRequest in every mode
    warnings: list[ReportWarning] = []
    kept: list[Any] = []
    if opts.mode == "none":
        final = ep
    else:
        table = _options_table(opts, warnings)
        final, kept = _run(ep, table, opts.keep_failing_ops, source_map)
    if kept:
        names = [str(op) for op in kept]
        warnings.append(
            ReportWarning(
                code="decomposition_ops_kept",
                message=(
                    "Decomposing these ops failed, so they were kept as they are: "
                    + ", ".join(names)
                    + ". Add them to decomposition.preserve to make that explicit."
                ),
                details={"ops": names, "reason": "decomposition_failed"},
            )
        )
    report = _report(ep, final, opts, kept)
    if opts.mode == "core_aten" and not opts.unroll_recurrent:
        warnings += recurrent.kept_warnings(report.ops_after)
    return Decomposed(ep=final, report=report, warnings=warnings)


def keep_until_verified(
    ep: ExportedProgram,
    opts: DecompositionOptions,
    decomposed: Decomposed,
    passes: Callable[[ExportedProgram], bool],
    *,
    failure: str,
    example: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
) -> Decomposed | None:
    """A decomposition that verifies, keeping the fewest ops undecomposed; None if none does.

    For a decomposed program that fails verification (it raises, or its outputs differ)
    while `ep`, the program before decomposition, passes: only ops of `ep` that the
    table decomposes can be kept. When the decomposed program raises on `example`, the
    op its failing node was decomposed from is tried alone first; otherwise (or when
    that is not enough) every candidate is kept and the set is shrunk by delta
    debugging (`shrink`). Every trial is one `run_decompositions` and one `passes`.

    Args:
        ep: the traced program `decomposed` was made from; not modified.
        opts: the options `decompose` ran with (mode other than "none").
        decomposed: what `decompose` returned; ops it already kept stay kept.
        passes: whether a program verifies (the caller's verification).
        failure: why the decomposed program failed, for the warning.
        example: (args, kwargs) to find the node a raising program fails at.
    """
    table = dict(_options_table(opts, []).items())
    base = [resolve_op(name) for name in decomposed.report.kept_after_failure]
    candidates = sorted(
        {op for op in _op_targets(ep.graph_module) if op in table and op not in base}, key=str
    )
    if not candidates:
        return None
    results: dict[frozenset[Any], ExportedProgram | None] = {}

    def attempt(keep: Iterable[Any]) -> ExportedProgram | None:
        key = frozenset(keep)
        if key not in results:
            skip = key | set(base)
            try:
                trial = ep.run_decompositions({k: v for k, v in table.items() if k not in skip})
            except Exception:  # a set that breaks the decomposition itself does not pass
                results[key] = None
            else:
                results[key] = trial if passes(trial) else None
        return results[key]

    suspect = _raising_op(decomposed.ep, ep, example) if example is not None else None
    if suspect in candidates and attempt([suspect]) is not None:
        minimal = [suspect]
    elif attempt(candidates) is not None:
        minimal = shrink(candidates, lambda trial: attempt(trial) is not None)
    else:
        return None
    final = results[frozenset(minimal)]
    assert final is not None  # shrink only keeps passing sets
    names = [str(op) for op in minimal]
    warnings = [
        *decomposed.warnings,
        ReportWarning(
            code="decomposition_ops_kept",
            message=(
                f"The decomposed program failed verification ({failure}) while the program "
                "before decomposition passed, so these ops were kept as they are: "
                + ", ".join(names)
                + ". Add them to decomposition.preserve to make that explicit."
            ),
            details={"ops": names, "reason": "verification_failed", "failure": failure},
        ),
    ]
    return Decomposed(
        ep=final, report=_report(ep, final, opts, [*base, *minimal]), warnings=warnings
    )


def resolve_op(name: str) -> torch._ops.OpOverload:
    """`"aten.conv2d.default"` (or `aten::conv2d.default`, `aten.conv2d`) → the overload.

    Raises:
        InvalidRequest: the text does not name an operator overload.
    """
    text = name.strip().removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    if len(parts) == 2:
        parts.append("default")
    found: Any = None
    if len(parts) == 3 and all(parts):
        namespace, op_name, overload = parts
        try:
            found = getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
        except (AttributeError, RuntimeError):
            found = None
    if not isinstance(found, torch._ops.OpOverload):
        raise InvalidRequest(
            f"{name!r} is not a torch operator overload.",
            hint='Write ops as torch prints them, e.g. "aten.conv2d.default"; custom ops '
            "must be registered by the uploaded module.",
            stage="decomposing",
            details={"op": name},
        )
    return found


def is_core_aten(op: Any) -> bool:
    """Whether `op` is an ATen overload of the core ATen set (tagged `torch.Tag.core`)."""
    return (
        isinstance(op, torch._ops.OpOverload)
        and op.namespace == "aten"
        and torch.Tag.core in op.tags
    )


def non_core_aten_ops(graph_module: torch.fx.GraphModule) -> list[str]:
    """Operator overloads of the graph (and its subgraphs) outside the core ATen set."""
    found = set()
    for target in _op_targets(graph_module):
        name = str(target)
        if not is_core_aten(target) and name not in _EXPORT_ASSERTIONS:
            found.add(name)
    return sorted(found)


# --- internals ----------------------------------------------------------------------------


def _options_table(opts: DecompositionOptions, warnings: list[ReportWarning]) -> Table:
    """The table of a mode other than "none", without the preserved ops."""
    preserve = [resolve_op(name) for name in opts.preserve]
    if opts.mode == "core_aten" and not opts.unroll_recurrent:
        preserve += recurrent.OPS
    table = _table(opts.mode, [resolve_op(name) for name in opts.decompose], warnings)
    for op in preserve:
        table.pop(op, None)
    return table


def _report(
    ep: ExportedProgram, final: ExportedProgram, opts: DecompositionOptions, kept: list[Any]
) -> DecompositionReport:
    before = op_histogram(ep.graph_module)
    after = op_histogram(final.graph_module)
    return DecompositionReport(
        mode=opts.mode,
        preserve=[str(resolve_op(name)) for name in opts.preserve],
        ops_before=before,
        ops_after=after,
        removed_ops=sorted(set(before) - set(after)),
        added_ops=sorted(set(after) - set(before)),
        non_core_aten_ops=non_core_aten_ops(final.graph_module),
        kept_after_failure=[str(op) for op in kept],
    )


_CODE_LINE = re.compile(r"^\s*(?P<node>[A-Za-z_][A-Za-z0-9_]*)\s*=")


def _raising_op(
    decomposed: ExportedProgram,
    ep: ExportedProgram,
    example: tuple[tuple[Any, ...], dict[str, Any]],
) -> Any:
    """The op of `ep` whose decomposition raised when `decomposed` ran on `example`.

    Runs the program once; the traceback's frame in the generated graph code names the
    node, whose `from_node` provenance names the node of `ep` it was decomposed from.
    """
    args, kwargs = copy.deepcopy(example)
    try:
        with torch.no_grad():
            decomposed.module()(*args, **kwargs)
    except Exception as exc:
        names: list[str] = []
        for frame, lineno in traceback.walk_tb(exc.__traceback__):
            module = frame.f_locals.get("self")
            generated = frame.f_code.co_filename.startswith("<eval_with_key")
            if generated and isinstance(module, torch.fx.GraphModule):
                lines = module.code.splitlines()
                match = _CODE_LINE.match(lines[lineno - 1]) if 0 < lineno <= len(lines) else None
                node = _node_named(module, match["node"]) if match else None
                if node is not None:
                    names = _provenance(node)
        for name in names:
            found = _node_named(ep.graph_module, name)
            if found is not None and isinstance(found.target, torch._ops.OpOverload):
                return found.target
    return None


def _provenance(node: torch.fx.Node) -> list[str]:
    """Names of the nodes `node` was made from (`meta["from_node"]`), nearest first."""
    names = [node.name]
    pending = list(node.meta.get("from_node") or [])
    while pending and len(names) < 64:
        source = pending.pop(0)
        name = getattr(source, "name", None)
        if isinstance(name, str) and name not in names:
            names.append(name)
        pending.extend(getattr(source, "from_node", None) or [])
    return names


def _table(mode: str, to_decompose: list[Any], warnings: list[ReportWarning]) -> Table:
    # torch's own lazy table: materializing it costs ~0.1 s, which only the search for
    # ops to keep (on failure) pays
    lazy = torch.export.default_decompositions()
    if mode != "custom":
        return lazy
    base: Table = dict(lazy.items())
    table: Table = {}
    unavailable = []
    for op in to_decompose:
        decomposition = base.get(op) or torch._decomp.decomposition_table.get(op)
        if decomposition is None:
            unavailable.append(str(op))
        else:
            table[op] = decomposition
    if unavailable:
        warnings.append(
            ReportWarning(
                code="decomposition_unavailable",
                message="torch has no decomposition for these ops; they were left as they "
                "are: " + ", ".join(unavailable),
                details={"ops": unavailable},
            )
        )
    return table


def _run(
    ep: ExportedProgram,
    table: Table,
    keep_failing_ops: bool,
    source_map: SourceMap | None,
) -> tuple[ExportedProgram, list[Any]]:
    """Run the decomposition; on failure, find the fewest ops to keep (see the module doc)."""
    results: dict[frozenset[Any], ExportedProgram | Exception] = {}

    def attempt(keep: Iterable[Any]) -> ExportedProgram | Exception:
        key = frozenset(keep)
        if key not in results:
            trial = {op: fn for op, fn in table.items() if op not in key} if key else table
            try:
                results[key] = ep.run_decompositions(trial)
            except Exception as exc:  # any failure of torch's pass; judged below
                results[key] = exc
        return results[key]

    first = attempt(())
    if isinstance(first, ExportedProgram):
        return first, []
    table = dict(table.items())
    candidates = sorted({op for op in _op_targets(ep.graph_module) if op in table}, key=str)
    if not keep_failing_ops or not candidates:
        failing = _failing_op(first, ep)
        ops = [failing] if failing is not None and failing in candidates else candidates
        raise _failure(first, ep, source_map, ops, kept_all=keep_failing_ops)

    # the op torch names in its error is the likeliest culprit: keep it and retry
    keep: set[Any] = set()
    outcome: ExportedProgram | Exception = first
    while isinstance(outcome, Exception):
        failing = _failing_op(outcome, ep)
        if failing is None or failing not in candidates or failing in keep:
            break
        keep.add(failing)
        outcome = attempt(keep)
    if isinstance(outcome, Exception):
        keep = set(candidates)
        outcome = attempt(keep)
        if isinstance(outcome, Exception):
            raise _failure(outcome, ep, source_map, candidates, kept_all=True)
    minimal = shrink(
        sorted(keep, key=str), lambda trial: isinstance(attempt(trial), ExportedProgram)
    )
    final = results[frozenset(minimal)]
    assert isinstance(final, ExportedProgram)  # shrink only keeps passing sets
    return final, minimal


def _failure(
    exc: Exception,
    ep: ExportedProgram,
    source_map: SourceMap | None,
    ops: list[Any],
    *,
    kept_all: bool,
) -> DecompositionFailed:
    node = _failing_node(exc, ep)
    details: dict[str, Any] = {"ops": [str(op) for op in ops], "exception": type(exc).__name__}
    if node is not None:
        details["node"] = node.name
        details["node_target"] = target_name(node.target)
    location: SourceLocation | None = None
    stack_trace = node.meta.get("stack_trace") if node is not None else None
    if source_map is not None and stack_trace:
        location = source_map.from_text(stack_trace)
    first_line = (str(exc).strip().splitlines() or [""])[0]
    if kept_all:
        hint = (
            "Keeping every decomposable op did not help: the failure comes from "
            "functionalizing the program itself (e.g. an in-place resize_ or set_). Change "
            'the code at the location shown, or use decomposition.mode "none".'
        )
    else:
        hint = (
            "Add the failing op to decomposition.preserve, or turn on "
            "decomposition.keep_failing_ops to keep failing ops automatically."
        )
    error = DecompositionFailed(
        f"run_decompositions failed: {type(exc).__name__}: {first_line}",
        hint=hint,
        stage="decomposing",
        location=location,
        details=details,
    )
    error.__cause__ = exc
    return error


def _op_targets(graph_module: torch.fx.GraphModule) -> set[Any]:
    """The operator overloads called anywhere in the graph or its subgraphs."""
    found: set[Any] = set()
    pending, seen = [graph_module], set()
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        for node in module.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                found.add(node.target)
        pending.extend(subgraphs(module).values())
    return found


def _failing_node(exc: BaseException, ep: ExportedProgram) -> torch.fx.Node | None:
    """The node torch's interpreter was running when `exc` escaped, if it says so."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _WHILE_EXECUTING.search(str(current))
        if match:
            return _node_named(ep.graph_module, match["node"])
        current = current.__cause__ or current.__context__
    return None


def _failing_op(exc: BaseException, ep: ExportedProgram) -> Any:
    node = _failing_node(exc, ep)
    return node.target if node is not None else None


def _node_named(graph_module: torch.fx.GraphModule, name: str) -> torch.fx.Node | None:
    for node in graph_module.graph.nodes:
        if node.name == name:
            return node
    for sub in subgraphs(graph_module).values():
        found = _node_named(sub, name)
        if found is not None:
            return found
    return None
