"""The classification rules of `engine.diagnostics.classification`: which contract code an exception
raised while tracing gets, with its message, hint and `details`.

`classify_cause` tries the rules in order (data-dependent, missing fake kernel, dynamic
shape violation, user error), first match wins; nothing matched, `_fallback` tells code
that failed under tracing (`unsupported_python`) from a bug (`internal_error`). The
rules themselves are listed in `engine.diagnostics.classification`' docstring.
"""

from __future__ import annotations

import re
from typing import Any

from engine.diagnostics import exportdb
from engine.diagnostics.exception_text import (
    branch_condition,
    chain_text,
    dynamic_output_op,
    essential,
    exc_type_name,
    exception_chain,
    exportdb_text,
    first_line,
    first_paragraph,
    graph_break_type,
    guard_expression,
    innermost_frame,
    link_text,
    observed_exception,
    op_name,
    python_expression,
    qualified_op,
    readable_sources,
    spec_key_mismatch,
    user_error_type,
)
from engine.diagnostics.source_map import SourceMap
from engine.errors import (
    DataDependent,
    DynamicShapeViolation,
    ExportError,
    InternalError,
    InvalidInputs,
    MissingFakeKernel,
    UnsupportedPython,
)
from schemas import SourceLocation

__all__ = ["classify_cause"]

_DATA_DEPENDENT_TEXT = re.compile(
    r"Could not (guard on|extract specialized integer from|compute) data-dependent "
    r"expression (?P<expr>.+?)(?: \(unhinted:.*?\))?\.?(?:\s+\(Size-like symbols:|\s*$)",
    re.MULTILINE,
)
_UNBACKED_SYMBOL = re.compile(r"\bu\d+\b")
_NO_FAKE_IMPL = re.compile(
    r"no fake impl registered for <CustomOpDef\((?P<op>[\w.]+::[\w.]+)\)>"
    r"|Could not run '(?P<op2>[\w.]+::[\w.]+)' with arguments from the 'Meta' backend"
    r"|unsupported operator: (?P<op3>[\w.]+)",
)
_MISSING_KERNEL_TEXT = re.compile(
    r"no fake impl|has no meta|does not have a meta|missing a fake kernel|'Meta' backend"
    r"|Operator does not support running with fake tensors",
    re.IGNORECASE,
)
_VIOLATED_DIMS = re.compile(r"Constraints violated \((?P<dims>[^)]*)\)")
_SUGGESTED_FIXES = re.compile(r"Suggested fixes:\n(?P<fixes>(?:[ \t]+\S.*(?:\n|$))+)")
_BULLET = re.compile(r"^\s*- (?P<text>.+)$", re.MULTILINE)
_HINT_LINE = re.compile(r"^\s*Hint: (?P<text>.+)$", re.MULTILINE)
_EXPLANATION_LINE = re.compile(r"^\s*Explanation: (?P<text>.*)$", re.MULTILINE)

# torch's own assertion failures: a bug somewhere in the stack, never a user pattern.
_INTERNAL_TYPES = frozenset(
    {"AssertionError", "InternalTorchDynamoError", "InternalError", "SpecViolationError"}
)


def classify_cause(
    chain: list[BaseException],
    exc: BaseException,
    stage: str,
    location: SourceLocation | None,
    source_map: SourceMap,
) -> ExportError:
    text = chain_text(exc)
    rules = (_data_dependent, _missing_fake_kernel, _shape_violation, _user_error)
    for rule in rules:
        found = rule(chain, text, source_map, location)
        if found is not None:
            cls, message, hint, details = found
            details = {"exception_type": exc_type_name(exc), **details}
            return cls(
                message,
                hint=hint,
                stage=stage,
                location=location,
                details=details,
                # a branch found from the source line counts as one for picking cases
                exportdb=exportdb.cases_for(
                    cls.code, exportdb_text(text) + (" branch" if details.get("branch") else "")
                ),
            )
    return _fallback(exc, stage, location, source_map, text)


_Found = tuple[type[ExportError], str, str | None, dict[str, Any]] | None


def _data_dependent(
    chain: list[BaseException],
    text: str,
    source_map: SourceMap,
    location: SourceLocation | None,
) -> _Found:
    names = {exc_type_name(link) for link in chain}
    graph_break = graph_break_type(chain)
    expr_match = _DATA_DEPENDENT_TEXT.search(text)
    aten_dynamic_output = dynamic_output_op(chain, aten=True)
    if not (
        {"GuardOnDataDependentSymNode", "DataDependentOutputException"} & names
        or expr_match
        or graph_break == "Data-dependent branching"
        or user_error_type(chain) == "DYNAMIC_CONTROL_FLOW"
        or aten_dynamic_output
    ):
        return None
    details: dict[str, Any] = {}
    if graph_break:
        details["graph_break"] = graph_break
    expression = guard_expression(chain) or (expr_match["expr"].strip() if expr_match else None)
    if expression:
        details["expression"] = expression
        details["symbols"] = sorted(set(_UNBACKED_SYMBOL.findall(expression)))
    if aten_dynamic_output:
        details["operator"] = aten_dynamic_output
    condition = branch_condition(location.code) if location else None
    details["branch"] = bool(
        condition
        or graph_break == "Data-dependent branching"
        or user_error_type(chain) == "DYNAMIC_CONTROL_FLOW"
    )
    decided = f" (`{expression}`)" if expression else ""
    if details["branch"]:
        message = (
            f"Data-dependent control flow: a branch depends on values inside a tensor{decided}, "
            "which export cannot know while tracing."
        )
        cond = condition or "pred"
        hint = (
            f"Express the branch with `torch.cond({cond}, true_fn, false_fn, (x,))` or make it "
            "branchless with `torch.where`; if the condition always holds for valid inputs, "
            f"assert it instead with `torch._check({cond})` (on a Python number, e.g. one "
            "from `.item()`)."
        )
    elif aten_dynamic_output:
        message = (
            f"Data-dependent shape: `{aten_dynamic_output}` returns a tensor whose size "
            "depends on its data, which export cannot know while tracing."
        )
        hint = "Bound the size with `torch._check(...)` right after the call."
    else:
        check = python_expression(expression) if expression else "..."
        message = (
            f"Data-dependent shape or value: export had to decide{decided or ' a condition'} "
            "from values inside a tensor, which it cannot know while tracing."
        )
        hint = (
            "Tell export what holds for the value read with `.item()` (or `.tolist()`): "
            f"add `torch._check({check})` with your variable in place of "
            f"`{', '.join(details.get('symbols') or ['u0'])}`, or `torch._check_is_size(n)` when "
            "it is a size, right after reading it."
        )
    return DataDependent, source_map.scrub(message), hint, details


def _missing_fake_kernel(
    chain: list[BaseException],
    text: str,
    source_map: SourceMap,
    location: SourceLocation | None,
) -> _Found:
    operator = None
    for link in chain:
        func = getattr(link, "func", None)
        if exc_type_name(link) == "UnsupportedOperatorException" and func is not None:
            operator = op_name(func)
            break
    operator = operator or dynamic_output_op(chain, aten=False)
    if operator is None:
        match = _NO_FAKE_IMPL.search(text)
        if match is None and not _MISSING_KERNEL_TEXT.search(text):
            return None
        if match is not None:
            operator = qualified_op(match["op"] or match["op2"] or match["op3"])
    details: dict[str, Any] = {}
    if operator:
        details["operator"] = operator
    name = f"`{operator}`" if operator else "A custom operator"
    message = (
        f"{name} has no fake (meta) kernel, so export cannot compute the shapes of its "
        "outputs without running it."
    )
    hint = (
        f'Register one with `@torch.library.register_fake("{operator or "ns::op"}")` on a '
        "function that takes the same arguments and returns empty tensors of the right "
        "shape and dtype (e.g. `torch.empty_like(x)`)."
    )
    return MissingFakeKernel, source_map.scrub(message), hint, details


def _shape_violation(
    chain: list[BaseException],
    text: str,
    source_map: SourceMap,
    location: SourceLocation | None,
) -> _Found:
    names = {exc_type_name(link) for link in chain}
    kind = user_error_type(chain)
    spec_input = kind == "INVALID_INPUT" and (
        "dynamic_shapes" in text or "dynamic-shapes-validation" in text
    )
    if not (
        {"ConstraintViolationError", "ValueRangeError"} & names
        or kind in ("CONSTRAINT_VIOLATION", "DYNAMIC_DIM")
        or spec_input
    ):
        return None
    fixes = _suggested_fixes(text)
    violations = list(
        dict.fromkeys(
            source_map.scrub(readable_sources(m["text"].strip())) for m in _BULLET.finditer(text)
        )
    )
    details: dict[str, Any] = {"suggested_fixes": fixes, "violations": violations}
    dims = _VIOLATED_DIMS.search(text)
    if dims:
        details["dims"] = [d.strip() for d in dims["dims"].split(",") if d.strip()]
    details["specialized"] = bool(
        re.search(r"specialized|static shape|not dynamic|to be a constant", text)
    )
    if spec_input:
        details["invalid_spec"] = True
        body = first_paragraph(essential(link_text(chain, "UserError") or text))
        message = f"The dynamic_shapes spec does not fit the inputs: {body}"
        missing, unexpected = spec_key_mismatch(text)
        if missing or unexpected:
            details.update(missing_keys=missing, unexpected_keys=unexpected)
            hint = _key_mismatch_hint(missing, unexpected)
        else:
            hint = "Give each input's spec the same structure as the input (dict or list)."
    else:
        # torch's advice after the first sentence is about APIs we hide (mark_dynamic)
        body = " ".join(v.split(". ")[0].rstrip(".") + "." for v in violations)
        body = body or first_paragraph(essential(text))
        message = f"The dynamic shapes you asked for conflict with the code: {body}"
        if fixes:
            hint = (
                "Change dynamic_shapes as torch suggests (" + "; ".join(fixes) + "), or "
                "turn on `auto_fix_dynamic_shapes` to apply these fixes and retry."
            )
        elif details["specialized"]:
            hint = (
                'The code forces this dimension to one value: mark it static (`"static"` or '
                'a number), use `"auto"` to let export decide, or make the code shape-generic.'
            )
        else:
            hint = "Narrow the ranges or relations in dynamic_shapes to what the code allows."
    return DynamicShapeViolation, source_map.scrub(message), hint, details


def _key_mismatch_hint(missing: list[str], unexpected: list[str]) -> str:
    parts = []
    if missing:
        keys = ", ".join(f"`{key}`" for key in missing)
        parts.append(f"Add {keys} to dynamic_shapes (None keeps an input static)")
    if unexpected:
        keys = ", ".join(f"`{key}`" for key in unexpected)
        parts.append(f"remove {keys}, which the inputs do not have")
    return "; ".join(parts) + "."


def _user_error(
    chain: list[BaseException],
    text: str,
    source_map: SourceMap,
    location: SourceLocation | None,
) -> _Found:
    kind = user_error_type(chain)
    graph_break = graph_break_type(chain)
    names = {exc_type_name(link) for link in chain}
    if kind == "INVALID_INPUT":
        body = first_paragraph(essential(link_text(chain, "UserError") or text))
        details: dict[str, Any] = {"user_error_type": kind}
        return (
            InvalidInputs,
            source_map.scrub(f"export rejected the inputs: {body}"),
            "Pass tensors (or nested lists, tuples and dicts of them) and plain constants.",
            details,
        )
    if kind is None and graph_break is None and "TorchRuntimeError" not in names:
        return None
    details = {}
    if kind is not None:
        details["user_error_type"] = kind
    if graph_break is not None:
        details["graph_break"] = graph_break
    hints = [m["text"].strip() for m in _HINT_LINE.finditer(text)]
    if hints:
        details["torch_hints"] = [source_map.scrub(h) for h in hints]
    explanation = _EXPLANATION_LINE.search(text)
    observed = observed_exception(chain) if graph_break == "Observed exception" else None
    if observed is not None:
        body = f"the traced code raised {observed}"
    elif graph_break and explanation and explanation["text"].strip():
        body = f"{graph_break}: {explanation['text'].strip()}"
    else:
        body = first_paragraph(essential(text))
    message = f"Tracing hit Python that export does not support: {body}"
    hint = (
        "Rewrite this line with torch operations, move it out of forward() (e.g. into "
        "__init__), or export in non-strict mode (`strict: false`), which runs Python "
        "as Python and only traces the tensor operations."
    )
    return UnsupportedPython, source_map.scrub(message), hint, details


def _fallback(
    exc: BaseException,
    stage: str,
    location: SourceLocation | None,
    source_map: SourceMap,
    text: str,
) -> ExportError:
    innermost = innermost_frame(exc)
    raised_in_user_code = innermost is not None and source_map.relative(innermost[0]) is not None
    internal = any(exc_type_name(link) in _INTERNAL_TYPES for link in exception_chain(exc))
    details: dict[str, Any] = {"exception_type": exc_type_name(exc)}
    summary = f"{exc_type_name(exc)}: {first_line(exc, source_map)}"
    if location is not None and (raised_in_user_code or not internal):
        details["raised_in_user_code"] = raised_in_user_code
        if raised_in_user_code:
            message = f"Your code raised {summary} while export traced it."
        else:
            message = f"Under export's tracing, this line failed with {summary}"
        hint = (
            "Export runs forward() on fake tensors that carry shapes but no data: code "
            "that checks exact tensor types, reads data pointers or converts to numpy/Python "
            "values behaves differently there. Rewrite it with torch operations, or try "
            "the other tracing mode (`strict`)."
        )
        return UnsupportedPython(
            message,
            hint=hint,
            stage=stage,
            location=location,
            details=details,
            exportdb=exportdb.cases_for(UnsupportedPython.code, exportdb_text(text)),
        )
    return InternalError(
        f"torchport failed unexpectedly; this is a bug in torchport, not in your model "
        f"({summary}).",
        stage=stage,
        location=location,
        details=details,
    )


def _suggested_fixes(text: str) -> list[str]:
    match = _SUGGESTED_FIXES.search(text)
    if match is None:
        return []
    return [line.strip() for line in match["fixes"].splitlines() if line.strip()]
