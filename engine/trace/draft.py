"""The full list of issues of a failed export, from `torch.export.draft_export`.

`torch.export.export` stops at the first problem; `draft_export` carries on (it
propagates real values through data-dependent code, assumes fake kernels, relaxes the
requested dynamic shapes) and records every problem in `ep._report`, a
`DraftExportReport` whose `failures` each have a `failure_type`, a `data` dict and an
`xfail` flag. This module turns them into the contract's `DraftIssue`s.

Issue types: `data_dependent` (torch's DATA_DEPENDENT_ERROR), `guard_added`,
`missing_fake_kernel`, `mismatched_fake_kernel`, and `draft_export_failed` when draft
export itself could not run (its message is the classified error).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator
from typing import Any

import torch

from engine.diagnostics.classification import classify
from engine.diagnostics.exception_text import branch_condition, python_expression, readable_sources
from engine.diagnostics.source_map import SourceMap
from engine.load.model import LoadedModel
from schemas import DraftIssue, SourceLocation

_log = logging.getLogger(__name__)

# Loggers that print banners and per-guard warnings while draft export runs. The
# structured-trace logger (`torch.__trace`) is not among them: draft export reads its
# findings from it.
_NOISY_LOGGERS = (
    "torch.export",
    "torch._export",
    "torch._dynamo",
    "torch.fx.experimental.symbolic_shapes",
    "torch.fx.experimental.recording",
    "torch.fx.passes.runtime_assert",
    "torch._subclasses",
    "torch._functorch",
)

_TYPE_NAMES = {
    "DATA_DEPENDENT_ERROR": "data_dependent",
    "GUARD_ADDED": "guard_added",
    "MISSING_FAKE_KERNEL": "missing_fake_kernel",
    "MISMATCHED_FAKE_KERNEL": "mismatched_fake_kernel",
}

_SYMBOL = re.compile(r"\b[su]\d+\b")


def draft_issues(loaded: LoadedModel, dynamic_shapes: Any, strict: bool) -> list[DraftIssue]:
    """Every issue `torch.export.draft_export` finds in the model; never raises.

    Draft export runs the model on real tensors alongside the fake ones, so call it
    after the real export failed, as the last use of `loaded.module`.

    Args:
        loaded: the model and its example inputs.
        dynamic_shapes: the spec in torch's form (as passed to `torch.export.export`).
        strict: trace with dynamo (True) or as Python (False).

    Returns:
        One issue per failure torch reported, in torch's order; a single
        `draft_export_failed` issue when draft export itself raised.
    """
    try:
        with quiet():
            ep = torch.export.draft_export(
                loaded.module,
                loaded.args,
                loaded.kwargs,
                dynamic_shapes=dynamic_shapes,
                strict=strict,
            )
        report = getattr(ep, "_report", None)
        if report is None:
            return []
        filenames = _filenames(report)
        return [_issue(failure, filenames, ep, loaded.source_map) for failure in report.failures]
    except Exception as exc:
        return [_failed(exc, loaded.source_map)]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence torch's banners, warnings and prints for the duration."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _failed(exc: BaseException, source_map: SourceMap) -> DraftIssue:
    try:
        error = classify(exc, stage="tracing", source_map=source_map)
        return DraftIssue(
            type="draft_export_failed",
            message=error.message,
            location=error.location,
            hint=error.hint,
            details={"code": error.code, **_jsonable(error.details)},
        )
    except Exception as inner:  # the report must still be written
        _log.warning("classifying a draft export failure failed: %r", inner)
        return DraftIssue(
            type="draft_export_failed",
            message=f"draft export failed: {type(exc).__name__}",
            details={"exception_type": type(exc).__name__},
        )


def _filenames(report: Any) -> dict[int, str]:
    """Interned file ids → paths.

    The report only knows the files interned during this call; a file seen by an earlier
    trace in the same process (the failed export before it) is in torch's intern table.
    """
    names: dict[int, str] = {}
    try:
        from torch._logging.structured import INTERN_TABLE

        names.update({index: path for path, index in INTERN_TABLE.items()})
    except ImportError:
        pass
    names.update(getattr(report, "str_to_filename", {}) or {})
    return names


def _issue(failure: Any, filenames: dict[int, str], ep: Any, source_map: SourceMap) -> DraftIssue:
    kind = getattr(failure.failure_type, "name", str(failure.failure_type))
    data: dict[str, Any] = failure.data
    issue_type = _TYPE_NAMES.get(kind, kind.lower())
    location = _stack_location(data.get("user_stack"), filenames, source_map)
    details: dict[str, Any] = {}
    if issue_type in ("data_dependent", "guard_added"):
        expr = str(data.get("expr", ""))
        details["expression"] = expr
        details["symbols"] = sorted(set(_SYMBOL.findall(expr)))
    if issue_type == "data_dependent":
        details["assumed"] = str(data.get("result"))
        details["occurrences"] = int(data.get("occurrences", 1))
        message = (
            f"Export could not decide `{expr}`, which depends on values inside a tensor; "
            f"draft export assumed `{data.get('result')}` from the example inputs and "
            "kept a runtime assertion of it."
        )
        condition = branch_condition(location.code) if location else None
        check = condition or python_expression(expr)
        hint = (
            f"State the assumption with `torch._check({check})`"
            + ("" if condition else " (with your variable in place of the symbol)")
            + ", `torch._check_is_size(n)` for a size, or use `torch.cond` for a branch."
        )
    elif issue_type == "guard_added":
        sources = data.get("symbol_to_sources") or {}
        details["sources"] = {str(k): readable_sources(str(v)) for k, v in sources.items()}
        details["new_dynamic_shapes"] = str(data.get("new_dynamic_shapes"))
        where = ", ".join(f"{k} = {v}" for k, v in details["sources"].items())
        message = (
            f"The code requires `{expr}`"
            + (f" (where {where})" if where else "")
            + ", which the requested dynamic shapes do not guarantee."
        )
        hint = (
            "Make dynamic_shapes agree with this guard (a static size, a narrower range or "
            'a relation between dims), or use "auto" for the dimensions involved.'
        )
    elif issue_type in ("missing_fake_kernel", "mismatched_fake_kernel"):
        operator = _qualified(str(data.get("op", "")))
        details["operator"] = operator
        location = location or _operator_location(ep, str(data.get("op", "")), source_map)
        if issue_type == "missing_fake_kernel":
            message = f"The custom operator `{operator}` has no fake (meta) kernel."
        else:
            details["reason"] = str(data.get("reason", ""))
            message = (
                f"The fake kernel of `{operator}` disagrees with its real kernel: "
                f"{details['reason']}."
            )
        hint = (
            f'Register a fake kernel with `@torch.library.register_fake("{operator}")` that '
            "returns empty tensors of the same shapes, dtypes and strides as the real one."
        )
    else:
        message = f"draft export reported {kind}."
        hint = None
    return DraftIssue(
        type=issue_type,
        message=source_map.scrub(message),
        location=location,
        hint=hint,
        xfail=bool(getattr(failure, "xfail", False)),
        details=_jsonable(details),
    )


def _stack_location(
    stack: Any, filenames: dict[int, str], source_map: SourceMap
) -> SourceLocation | None:
    found = None
    for frame in stack or []:
        path = filenames.get(frame.get("filename"), frame.get("filename"))
        line = frame.get("line")
        if isinstance(path, str) and isinstance(line, int):
            found = source_map.location(path, line) or found
    return found


def _operator_location(ep: Any, op: str, source_map: SourceMap) -> SourceLocation | None:
    """Where the program calls `op` (`ns.name.overload`), from the nodes' stack traces."""
    try:
        for node in ep.graph.nodes:
            if node.op == "call_function" and str(node.target) == op:
                trace = node.meta.get("stack_trace")
                if trace:
                    return source_map.from_text(trace)
    except Exception:
        return None
    return None


def _qualified(op: str) -> str:
    parts = op.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 and "::" not in op else op


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
