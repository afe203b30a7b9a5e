"""Turns torch's exceptions into torchport errors: the one place that does.

`classify(exc, stage=, source_map=)` returns an `ExportError` carrying a contract code, a
message a person understands (torch's boilerplate stripped, server paths scrubbed), a
concrete hint, the innermost location in the user's code, machine-readable `details` and
the matching ExportDB cases.

Rules, first match wins (the exception's whole `__cause__`/`__context__` chain is read,
because dynamo and export wrap the original error, sometimes more than once):

1. An `ExportError` passes through unchanged.
2. Stage `decomposing` → `decomposition_failed`; stage `serializing` →
   `serialization_failed`; stage `verifying` → `verification_failed` when the exported
   program itself raised (its fx code is on the stack; otherwise the rules below
   apply). What the rules below would have said, unless an internal error, goes into
   `details["cause_code"]`.
3. `data_dependent`: `GuardOnDataDependentSymNode`, `DataDependentOutputException`,
   text "Could not guard on / extract specialized integer from data-dependent
   expression", dynamo's "Data-dependent branching" graph break, `UserError`
   `DYNAMIC_CONTROL_FLOW`, and `DynamicOutputShapeException` of an ATen operator.
   Checked before constraint violations: dynamo re-raises a data-dependent guard as a
   `CONSTRAINT_VIOLATION` UserError.
4. `missing_fake_kernel`: `UnsupportedOperatorException` (a custom op with no
   fake/meta kernel), "no fake impl registered", "Could not run … 'Meta' backend",
   "has no meta", `DynamicOutputShapeException` of a non-ATen operator, and dynamo's
   "Operator does not support running with fake tensors".
5. `dynamic_shape_violation`: `ConstraintViolationError`, `ValueRangeError`, `UserError`
   `CONSTRAINT_VIOLATION` / `DYNAMIC_DIM`, and `INVALID_INPUT` errors about the
   dynamic-shapes spec itself (ExportDB case `dynamic_shapes_validation`).
6. `invalid_inputs`: any other `UserError` `INVALID_INPUT` (export rejects an input).
7. `unsupported_python`: dynamo's `Unsupported` graph breaks, every other `UserError`
   (`ANTI_PATTERN`, `STANDARD_LIBRARY`, `INVALID_OUTPUT`, …), and `TorchRuntimeError`
   (an operation failed under fake tensors in strict mode).
8. Nothing matched: if the innermost frame of the traceback is user code, the user's code
   raised while being traced (it behaves differently under fake tensors: a type check, a
   data pointer, numpy) → `unsupported_python` with `details["raised_in_user_code"]`.
   If the innermost frame is torch's but the stack passes through user code and the
   exception is not one of torch's internal-assertion types, torch refused something the
   user's line asked for (e.g. `.numpy()` of a fake tensor) → `unsupported_python` as well.
9. Anything else (no user frame, or an internal assertion of torch or of ours) →
   `internal_error`, whose message says it is a bug of torchport.

The location is the innermost user frame from, in order: dynamo's `real_stack` (strict
mode traces symbolically, so the Python traceback never enters user code), the Python
traceback chain (non-strict), and `File "…", line N` in the text.
"""

from __future__ import annotations

import errno
import re
import traceback
from collections.abc import Iterator
from typing import Any

from engine import exportdb
from engine.errors import (
    DataDependent,
    DecompositionFailed,
    DiskQuotaExceeded,
    DynamicShapeViolation,
    ExportError,
    InternalError,
    InvalidInputs,
    MissingFakeKernel,
    OutOfMemory,
    SerializationFailed,
    UnsupportedPython,
    VerificationFailed,
)
from engine.source_map import SourceMap
from schemas import SourceLocation

# Lines of torch's messages that only help torch developers or repeat what we say.
_BOILERPLATE = re.compile(
    r"^\s*("
    r"The error above occurred when calling torch\.export"
    r"|For more information"
    r"|For extended logs"
    r"|If you suspect the guard"
    r"|For more debugging help"
    r"|For C\+\+ stack trace"
    r"|Set TORCHDYNAMO_VERBOSE"
    r"|For more details about this graph break"
    r"|Developer debug context"
    r"|consider using data-dependent friendly APIs"
    r"|Caused by:"
    r"|\(snipped"
    r").*$"
)
# Headers of printed stacks; the stack runs to the next blank line.
_STACK_HEADER = re.compile(
    r"^\s*(from user code:|User Stack.*:|User stack:|The following call raised this error:"
    r"|Traceback \(most recent call last\):)\s*$"
)
_FILE_LINE = re.compile(r'^\s*File "')

_DATA_DEPENDENT_TEXT = re.compile(
    r"Could not (guard on|extract specialized integer from|compute) data-dependent "
    r"expression (?P<expr>.+?)(?: \(unhinted:.*?\))?\.?(?:\s+\(Size-like symbols:|\s*$)",
    re.MULTILINE,
)
_UNBACKED_SYMBOL = re.compile(r"\bu\d+\b")
_BRANCH_LINE = re.compile(r"^(?:if|elif|while)\s+(?P<cond>.+?):\s*(?:#.*)?$")
_SYMPY_RELATION = re.compile(r"^(?P<rel>Eq|Ne)\((?P<a>[^,()]+), (?P<b>[^,()]+)\)$")
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
_CONSTANT_STR = re.compile(r'ConstantVariable\(str: "(?P<text>.*)"\)', re.DOTALL)
_EXPORTDB_LINK = re.compile(r"exportdb/index\.html#[\w-]+")
_SIZE_SOURCE = re.compile(r"L\['(?P<arg>\w+)'\]\.size\(\)\[(?P<dim>\d+)\]")
_BULLET = re.compile(r"^\s*- (?P<text>.+)$", re.MULTILINE)
_HINT_LINE = re.compile(r"^\s*Hint: (?P<text>.+)$", re.MULTILINE)
_EXPLANATION_LINE = re.compile(r"^\s*Explanation: (?P<text>.*)$", re.MULTILINE)

# torch's own assertion failures: a bug somewhere in the stack, never a user pattern.
_INTERNAL_TYPES = frozenset(
    {"AssertionError", "InternalTorchDynamoError", "InternalError", "SpecViolationError"}
)
_ATEN_NAMESPACES = frozenset({"aten", "prims", "prim"})


def classify(exc: BaseException, *, stage: str, source_map: SourceMap) -> ExportError:
    """Map any exception raised while exporting to an `ExportError` with a contract code.

    Args:
        exc: what the stage raised.
        stage: the contract stage it was raised in (`tracing`, `decomposing`, …).
        source_map: where the upload lives, to find and name locations in user code.

    Returns:
        The error to report; `exc` itself when it already is an `ExportError`.
    """
    if isinstance(exc, ExportError):
        return exc
    chain = list(_chain(exc))
    location = locate(exc, source_map)
    cause = _classify_tracing(chain, exc, stage, location, source_map)
    wrapper = _STAGE_ERRORS.get(stage)
    if wrapper is None or (stage == "verifying" and not _ran_program(exc)):
        return cause
    error_type, what, hint = wrapper
    details: dict[str, Any] = {"exception_type": _type_name(exc)}
    if not isinstance(cause, InternalError):  # what tracing would call it, when it knows
        details["cause_code"] = cause.code
        details.update({k: v for k, v in cause.details.items() if k != "exception_type"})
    return error_type(
        f"{what} failed: {_type_name(exc)}: {_first_line(exc, source_map)}",
        hint=hint,
        stage=stage,
        location=location,
        details=details,
        exportdb=cause.exportdb,
    )


def limit_reached(error: ExportError) -> ExportError | None:
    """The job's own limit when one was what failed `error`, whatever the stage and
    whatever code the stage gave it: memory (a `MemoryError`, torch's
    `OutOfMemoryError`, ENOMEM) or the largest file it may write (EFBIG, RLIMIT_FSIZE).
    The stage's code and message are kept in `details`. None when no limit was hit."""
    for link in _chain(error):
        if isinstance(link, MemoryError) or _errno(link) == errno.ENOMEM or _torch_oom(link):
            return OutOfMemory(
                "The job ran out of memory (over its memory_mb limit).",
                stage=error.stage,
                details={"original_code": error.code},
            )
        if _errno(link) == errno.EFBIG:
            return DiskQuotaExceeded(
                "The job wrote a file larger than the sandbox allows.",
                stage=error.stage,
                location=error.location,
                details={"original_code": error.code, "original_message": error.message},
            )
    return None


def _errno(exc: BaseException) -> int | None:
    return exc.errno if isinstance(exc, OSError) else None


def _torch_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def locate(exc: BaseException, source_map: SourceMap) -> SourceLocation | None:
    """The innermost frame of user code the exception came from, or None."""
    for link in _chain(exc):
        stack = getattr(link, "real_stack", None)
        if stack:
            found = _innermost(((frame.filename, frame.lineno) for frame in stack), source_map)
            if found is not None:
                return found
    found = source_map.from_exception(exc)
    if found is not None:
        return found
    return source_map.from_text(_chain_text(exc))


def essential(text: str) -> str:
    """torch's message without stacks, links for developers and logging advice."""
    kept: list[str] = []
    in_stack = False
    for line in text.splitlines():
        if _STACK_HEADER.match(line):
            in_stack = True
            continue
        if in_stack:
            if line.strip() and (_FILE_LINE.match(line) or line.startswith((" ", "\t"))):
                continue
            in_stack = False
        if _BOILERPLATE.match(line) or _FILE_LINE.match(line):
            continue
        if "exportdb/index.html" in line:
            line = line.split("For more information about this error, see:")[0]
        kept.append(line.rstrip())
    out = "\n".join(kept).strip()
    return re.sub(r"\n{3,}", "\n\n", out)


def _classify_tracing(
    chain: list[BaseException],
    exc: BaseException,
    stage: str,
    location: SourceLocation | None,
    source_map: SourceMap,
) -> ExportError:
    text = _chain_text(exc)
    rules = (_data_dependent, _missing_fake_kernel, _shape_violation, _user_error)
    for rule in rules:
        found = rule(chain, text, source_map, location)
        if found is not None:
            cls, message, hint, details = found
            details = {"exception_type": _type_name(exc), **details}
            return cls(
                message,
                hint=hint,
                stage=stage,
                location=location,
                details=details,
                # a branch found from the source line counts as one for picking cases
                exportdb=exportdb.cases_for(
                    cls.code, _exportdb_text(text) + (" branch" if details.get("branch") else "")
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
    names = {_type_name(link) for link in chain}
    graph_break = _graph_break(chain)
    expr_match = _DATA_DEPENDENT_TEXT.search(text)
    aten_dynamic_output = _dynamic_output_op(chain, aten=True)
    if not (
        {"GuardOnDataDependentSymNode", "DataDependentOutputException"} & names
        or expr_match
        or graph_break == "Data-dependent branching"
        or _user_error_type(chain) == "DYNAMIC_CONTROL_FLOW"
        or aten_dynamic_output
    ):
        return None
    details: dict[str, Any] = {}
    if graph_break:
        details["graph_break"] = graph_break
    expression = _guard_expression(chain) or (expr_match["expr"].strip() if expr_match else None)
    if expression:
        details["expression"] = expression
        details["symbols"] = sorted(set(_UNBACKED_SYMBOL.findall(expression)))
    if aten_dynamic_output:
        details["operator"] = aten_dynamic_output
    condition = branch_condition(location.code) if location else None
    details["branch"] = bool(
        condition
        or graph_break == "Data-dependent branching"
        or _user_error_type(chain) == "DYNAMIC_CONTROL_FLOW"
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
        if _type_name(link) == "UnsupportedOperatorException" and func is not None:
            operator = _op_name(func)
            break
    operator = operator or _dynamic_output_op(chain, aten=False)
    if operator is None:
        match = _NO_FAKE_IMPL.search(text)
        if match is None and not _MISSING_KERNEL_TEXT.search(text):
            return None
        if match is not None:
            operator = _qualified(match["op"] or match["op2"] or match["op3"])
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
    names = {_type_name(link) for link in chain}
    kind = _user_error_type(chain)
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
        body = _first_paragraph(essential(_link_text(chain, "UserError") or text))
        message = f"The dynamic_shapes spec does not fit the inputs: {body}"
        hint = "Give each input's spec the same structure as the input (dict or list)."
    else:
        # torch's advice after the first sentence is about APIs we hide (mark_dynamic)
        body = " ".join(v.split(". ")[0].rstrip(".") + "." for v in violations)
        body = body or _first_paragraph(essential(text))
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


def _user_error(
    chain: list[BaseException],
    text: str,
    source_map: SourceMap,
    location: SourceLocation | None,
) -> _Found:
    kind = _user_error_type(chain)
    graph_break = _graph_break(chain)
    names = {_type_name(link) for link in chain}
    if kind == "INVALID_INPUT":
        body = _first_paragraph(essential(_link_text(chain, "UserError") or text))
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
    observed = _observed_exception(chain) if graph_break == "Observed exception" else None
    if observed is not None:
        body = f"the traced code raised {observed}"
    elif graph_break and explanation and explanation["text"].strip():
        body = f"{graph_break}: {explanation['text'].strip()}"
    else:
        body = _first_paragraph(essential(text))
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
    innermost = _innermost_frame(exc)
    raised_in_user_code = innermost is not None and source_map.relative(innermost[0]) is not None
    internal = any(_type_name(link) in _INTERNAL_TYPES for link in _chain(exc))
    details: dict[str, Any] = {"exception_type": _type_name(exc)}
    summary = f"{_type_name(exc)}: {_first_line(exc, source_map)}"
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
            exportdb=exportdb.cases_for(UnsupportedPython.code, _exportdb_text(text)),
        )
    return InternalError(
        f"torchport failed unexpectedly; this is a bug in torchport, not in your model "
        f"({summary}).",
        stage=stage,
        location=location,
        details=details,
    )


_STAGE_ERRORS: dict[str, tuple[type[ExportError], str, str]] = {
    "decomposing": (
        DecompositionFailed,
        "Decomposing the program (run_decompositions)",
        "Keep the failing operator whole with `decomposition.preserve`, or export without "
        'decomposition (`decomposition.mode: "none"`).',
    ),
    "serializing": (
        SerializationFailed,
        "Saving the exported program",
        "When the message names a custom object, an opaque type or a constant, keep it out "
        'of forward() or turn it into a tensor; export with `decomposition.mode: "none"` '
        "to see whether a decomposed operator is the cause.",
    ),
    "verifying": (
        VerificationFailed,
        "Running the exported program",
        "The exported program raised where eager did not: check the runtime assertions "
        "(`torch._check`) and the dynamic ranges against the sample inputs.",
    ),
}


def _ran_program(exc: BaseException) -> bool:
    """Whether the exception came out of running an exported program (fx generated code)."""
    return any(
        frame.filename.startswith("<eval_with_key>")
        for link in _chain(exc)
        for frame in traceback.extract_tb(link.__traceback__)
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _chain_text(exc: BaseException) -> str:
    return "\n".join(_safe_str(link) for link in _chain(exc))


def _exportdb_text(text: str) -> str:
    """What ExportDB matching reads: torch's message without its prose about logging and
    stacks (whose words would pick unrelated cases), plus any case torch linked."""
    links = " ".join(m.group(0) for m in _EXPORTDB_LINK.finditer(text))
    return f"{essential(text)} {links}"


def _link_text(chain: list[BaseException], type_name: str) -> str | None:
    for link in chain:
        if _type_name(link) == type_name:
            return _safe_str(link)
    return None


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ of a user exception must not hide the error
        return repr(exc.args)


def _type_name(exc: BaseException) -> str:
    return type(exc).__name__


def _first_line(exc: BaseException, source_map: SourceMap) -> str:
    body = essential(_safe_str(exc)) or _safe_str(exc)
    line = body.strip().splitlines()[0] if body.strip() else ""
    return source_map.scrub(line)


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def _user_error_type(chain: list[BaseException]) -> str | None:
    for link in chain:
        kind = getattr(link, "error_type", None)
        if _type_name(link) == "UserError" and kind is not None:
            return str(getattr(kind, "name", kind))
    return None


def _graph_break(chain: list[BaseException]) -> str | None:
    for link in chain:
        gb_type = getattr(link, "gb_type", None)
        if isinstance(gb_type, str) and gb_type:
            return gb_type
    return None


def _observed_exception(chain: list[BaseException]) -> str | None:
    """`TypeError: …` for dynamo's ObservedTypeError: the error the traced code raised."""
    for link in chain:
        name = _type_name(link)
        if name.startswith("Observed") and name != "ObservedException":
            text = _safe_str(link)
            match = _CONSTANT_STR.search(text)
            return f"{name.removeprefix('Observed')}: {match['text'] if match else text}"
    return None


def _guard_expression(chain: list[BaseException]) -> str | None:
    for link in chain:
        cond = getattr(link, "cond", None)
        if _type_name(link) == "GuardOnDataDependentSymNode" and cond is not None:
            return str(cond)
    return None


def _dynamic_output_op(chain: list[BaseException], *, aten: bool) -> str | None:
    for link in chain:
        func = getattr(link, "func", None)
        if _type_name(link) == "DynamicOutputShapeException" and func is not None:
            name = _op_name(func)
            if (name.split("::")[0] in _ATEN_NAMESPACES) == aten:
                return name
    return None


def _op_name(func: Any) -> str:
    """`ns::op` of an OpOverload (what `torch.library.register_fake` takes)."""
    try:
        return str(func.name())
    except Exception:
        return _qualified(str(func))


def _qualified(name: str) -> str:
    if "::" in name:
        return name
    parts = name.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else name


def branch_condition(code: str | None) -> str | None:
    """`n > 3` for the source line `if n > 3:` (also `elif`, `while`); None otherwise."""
    match = _BRANCH_LINE.match(code or "")
    return match["cond"].strip() if match else None


def readable_sources(text: str) -> str:
    """`L['x'].size()[0]` → `x.shape[0]`: dynamo's guard sources as the user names them."""
    return _SIZE_SOURCE.sub(lambda m: f"{m['arg']}.shape[{m['dim']}]", text)


def python_expression(expr: str) -> str:
    """`Eq(u0, 1)` → `u0 == 1`: sympy's relations as a person writes them in Python."""
    match = _SYMPY_RELATION.match(expr)
    if match is None:
        return expr
    op = "==" if match["rel"] == "Eq" else "!="
    return f"{match['a']} {op} {match['b']}"


def _suggested_fixes(text: str) -> list[str]:
    match = _SUGGESTED_FIXES.search(text)
    if match is None:
        return []
    return [line.strip() for line in match["fixes"].splitlines() if line.strip()]


def _innermost(
    frames: Iterator[tuple[str, int | None]], source_map: SourceMap
) -> SourceLocation | None:
    found = None
    for filename, line in frames:
        if line is not None:
            loc = source_map.location(filename, line)
            if loc is not None:
                found = loc
    return found


def _innermost_frame(exc: BaseException) -> tuple[str, int | None] | None:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    return frames[-1].filename, frames[-1].lineno
