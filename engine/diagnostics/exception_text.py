"""Reading torch's exceptions: the cause chain, the text, what dynamo and export attach.

Helpers of `engine.diagnostics.classification`: the exception's whole
`__cause__`/`__context__` chain
(`exception_chain`), torch's message without stacks and developer boilerplate
(`essential`), the attributes dynamo and export set on their errors (`UserError`'s
`error_type`, a graph break's `gb_type`, a guard's `cond`, an operator's `func`), and the
innermost frame of user code (`locate`). Also the small rewrites the messages use:
`branch_condition`, `readable_sources`, `python_expression`.
"""

from __future__ import annotations

import ast
import re
import traceback
from collections.abc import Iterator
from typing import Any

from engine.diagnostics.source_map import SourceMap
from schemas import SourceLocation

__all__ = [
    "branch_condition",
    "chain_text",
    "dynamic_output_op",
    "essential",
    "exc_type_name",
    "exception_chain",
    "exportdb_text",
    "first_line",
    "first_paragraph",
    "graph_break_type",
    "guard_expression",
    "innermost_frame",
    "link_text",
    "locate",
    "observed_exception",
    "op_name",
    "python_expression",
    "qualified_op",
    "readable_sources",
    "spec_key_mismatch",
    "user_error_type",
]

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
_BRANCH_LINE = re.compile(r"^(?:if|elif|while)\s+(?P<cond>.+?):\s*(?:#.*)?$")
_SYMPY_RELATION = re.compile(r"^(?P<rel>Eq|Ne)\((?P<a>[^,()]+), (?P<b>[^,()]+)\)$")
_CONSTANT_STR = re.compile(r'ConstantVariable\(str: "(?P<text>.*)"\)', re.DOTALL)
_EXPORTDB_LINK = re.compile(r"exportdb/index\.html#[\w-]+")
_SIZE_SOURCE = re.compile(r"L\['(?P<arg>\w+)'\]\.size\(\)\[(?P<dim>\d+)\]")
_ATEN_NAMESPACES = frozenset({"aten", "prims", "prim"})
# torch's two ways of saying a dict spec's keys are not the input's (torch/export/dynamic_shapes.py)
_TOP_LEVEL_KEYS = re.compile(
    r"top-level keys must be the arg names (?P<expected>\[[^\]]*\]) of `\w+`, "
    r"but here they are (?P<got>\[[^\]]*\])"
)
_NESTED_KEYS = re.compile(
    r"`\w+(?P<path>[^`]*)` has keys (?P<expected>\[[^\]]*\]), "
    r"but `dynamic_shapes[^`]*` has keys (?P<got>\[[^\]]*\])"
)
_KEY_PATH_PART = re.compile(r"\[(?:'(?P<key>[^']*)'|(?P<index>\d+))\]")


def locate(exc: BaseException, source_map: SourceMap) -> SourceLocation | None:
    """The innermost frame of user code the exception came from, or None."""
    for link in exception_chain(exc):
        stack = getattr(link, "real_stack", None)
        if stack:
            found = _innermost(((frame.filename, frame.lineno) for frame in stack), source_map)
            if found is not None:
                return found
    found = source_map.from_exception(exc)
    if found is not None:
        return found
    return source_map.from_text(chain_text(exc))


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


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def chain_text(exc: BaseException) -> str:
    return "\n".join(_safe_str(link) for link in exception_chain(exc))


def exportdb_text(text: str) -> str:
    """What ExportDB matching reads: torch's message without its prose about logging and
    stacks (whose words would pick unrelated cases), plus any case torch linked."""
    links = " ".join(m.group(0) for m in _EXPORTDB_LINK.finditer(text))
    return f"{essential(text)} {links}"


def link_text(chain: list[BaseException], type_name: str) -> str | None:
    for link in chain:
        if exc_type_name(link) == type_name:
            return _safe_str(link)
    return None


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ of a user exception must not hide the error
        return repr(exc.args)


def exc_type_name(exc: BaseException) -> str:
    return type(exc).__name__


def first_line(exc: BaseException, source_map: SourceMap) -> str:
    body = essential(_safe_str(exc)) or _safe_str(exc)
    line = body.strip().splitlines()[0] if body.strip() else ""
    return source_map.scrub(line)


def first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def user_error_type(chain: list[BaseException]) -> str | None:
    for link in chain:
        kind = getattr(link, "error_type", None)
        if exc_type_name(link) == "UserError" and kind is not None:
            return str(getattr(kind, "name", kind))
    return None


def graph_break_type(chain: list[BaseException]) -> str | None:
    for link in chain:
        gb_type = getattr(link, "gb_type", None)
        if isinstance(gb_type, str) and gb_type:
            return gb_type
    return None


def observed_exception(chain: list[BaseException]) -> str | None:
    """`TypeError: …` for dynamo's ObservedTypeError: the error the traced code raised."""
    for link in chain:
        name = exc_type_name(link)
        if name.startswith("Observed") and name != "ObservedException":
            text = _safe_str(link)
            match = _CONSTANT_STR.search(text)
            return f"{name.removeprefix('Observed')}: {match['text'] if match else text}"
    return None


def guard_expression(chain: list[BaseException]) -> str | None:
    for link in chain:
        cond = getattr(link, "cond", None)
        if exc_type_name(link) == "GuardOnDataDependentSymNode" and cond is not None:
            return str(cond)
    return None


def dynamic_output_op(chain: list[BaseException], *, aten: bool) -> str | None:
    for link in chain:
        func = getattr(link, "func", None)
        if exc_type_name(link) == "DynamicOutputShapeException" and func is not None:
            name = op_name(func)
            if (name.split("::")[0] in _ATEN_NAMESPACES) == aten:
                return name
    return None


def op_name(func: Any) -> str:
    """`ns::op` of an OpOverload (what `torch.library.register_fake` takes)."""
    try:
        return str(func.name())
    except Exception:
        return qualified_op(str(func))


def qualified_op(name: str) -> str:
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


def spec_key_mismatch(text: str) -> tuple[list[str], list[str]]:
    """The keys torch says a dict dynamic-shapes spec lacks and has too many, dotted
    (`use_cache`, `extra.mask`); two empty lists when the text says neither."""
    for pattern in (_TOP_LEVEL_KEYS, _NESTED_KEYS):
        match = pattern.search(text)
        if match is None:
            continue
        try:
            expected = [str(k) for k in ast.literal_eval(match["expected"])]
            got = [str(k) for k in ast.literal_eval(match["got"])]
        except (ValueError, SyntaxError):
            continue
        parts = [
            p["key"] or p["index"]
            for p in _KEY_PATH_PART.finditer(match.groupdict().get("path") or "")
        ]
        prefix = "".join(f"{part}." for part in parts)
        return (
            [prefix + key for key in expected if key not in got],
            [prefix + key for key in got if key not in expected],
        )
    return [], []


def python_expression(expr: str) -> str:
    """`Eq(u0, 1)` → `u0 == 1`: sympy's relations as a person writes them in Python."""
    match = _SYMPY_RELATION.match(expr)
    if match is None:
        return expr
    op = "==" if match["rel"] == "Eq" else "!="
    return f"{match['a']} {op} {match['b']}"


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


def innermost_frame(exc: BaseException) -> tuple[str, int | None] | None:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    return frames[-1].filename, frames[-1].lineno
