"""Which op of the program a converter failed on, and the user's line that produced it.

The converters name the op in their own words:

- the ONNX exporter: `Error when translating node %histc : … target=torch.ops.aten.histc.default`
  (a `ConversionError` in the cause chain, naming the graph node) and `No ONNX function
  found for <OpOverload(op='aten._linalg_eigh', overload='default')>` (`DispatchError`);
- ExecuTorch: `Operator torch._ops.aten.histc.default is not in Core ATen opset` or `… is
  not Aten Canonical` (the edge dialect's verifier), `Missing out variants: {'aten::histc'}`
  (`to_executorch`, an op without an out-variant kernel).

`named_op(exc)` reads these from the whole exception chain; `pinpoint` finds the op's
node in the program (by the node's name, else the first call of the op) and maps the
node's `stack_trace` to the uploaded file with the job's `SourceMap`, so the error names
the op and the user's line, as tracing errors do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch

from engine.diagnostics.exception_text import chain_text
from engine.diagnostics.source_map import SourceMap
from engine.targets.registry import TARGETS
from schemas import ErrorBody

__all__ = ["named_op", "pinpoint"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NODE = re.compile(
    r"Error when translating node %(?P<node>[\w.]+) : .*?target=(?:torch\.ops\.)?(?P<op>[\w.:]+)"
)
_OVERLOAD = re.compile(r"<OpOverload\(op='(?P<op>[\w.:]+)', overload='(?P<overload>\w+)'\)>")
_NOT_CORE = re.compile(
    r"Operator torch\._ops\.(?P<op>[\w.]+) is not (?:in Core ATen opset|Aten Canonical)"
)
_OUT_VARIANTS = re.compile(r"Missing out variants: \{'(?P<op>[\w:.]+)'")


def named_op(exc: BaseException) -> dict[str, str]:
    """`{"op": …, "node": …}` as far as the converter's error names them (`op` in torch's
    spelling, `aten.histc.default`; `node` the graph node's name); empty when it names none."""
    text = _ANSI.sub("", chain_text(exc))
    found: dict[str, str] = {}
    node = _NODE.search(text)
    if node is not None:
        found = {"op": node["op"], "node": node["node"]}
    for pattern in (_OVERLOAD, _NOT_CORE, _OUT_VARIANTS):
        match = pattern.search(text)
        if match is not None and "op" not in found:
            op = match["op"].replace("::", ".")
            overload = match.groupdict().get("overload")
            found["op"] = f"{op}.{overload}" if overload else op
    return found


def pinpoint(
    error: ErrorBody,
    programs: Iterable[torch.export.ExportedProgram],
    source_map: SourceMap,
) -> ErrorBody:
    """`error` (a target's `target_failed`) with the op's location in the uploaded code and
    a hint naming both; unchanged when its details name no op."""
    details = dict(error.details)
    op = details.get("op")
    if not isinstance(op, str):
        return error
    name = details.get("target", "the target")
    location = error.location
    node = _find(programs, details.get("node"), op)
    if node is not None and location is None:
        location = source_map.from_text(str(node.meta.get("stack_trace") or ""))
    where = ""
    if location is not None:
        details["location"] = location.model_dump(mode="json")
        code = f" (`{location.code}`)" if location.code else ""
        where = f", made by {location.file}:{location.line}{code},"
    hint = (
        f"`{op}`{where} {_what_fails(name)}: write that step with "
        f"other torch operations, or leave {name} out of targets. program.pt2 is unaffected."
    )
    return error.model_copy(update={"hint": hint, "location": location, "details": details})


def _find(
    programs: Iterable[torch.export.ExportedProgram], node_name: Any, op: str
) -> torch.fx.Node | None:
    """The op's node: by its name where the converter gave it, else the first call of it."""
    graphs = [program.graph for program in programs]
    for graph in graphs:
        for node in graph.nodes:
            if node.name == node_name and _calls(node, op):
                return node
    for graph in graphs:
        for node in graph.nodes:
            if _calls(node, op):
                return node
    return None


def _calls(node: torch.fx.Node, op: str) -> bool:
    target = str(node.target) if node.op == "call_function" else ""
    return target == op or target.startswith(op + ".")


def _what_fails(name: str) -> str:
    """How target `name`'s refusal of one op reads (its registry row's `failed_op`)."""
    row = TARGETS.get(name)
    return row.failed_op if row is not None and row.failed_op else f"fails in {name}"
