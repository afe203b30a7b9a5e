"""Links errors to torch's ExportDB, the catalogue of export examples (`torch._export.db`).

An error carries the names of the ExportDB cases that show the supported way to write
the code that failed. Cases are matched by their tags (`torch.cond`,
`torch.dynamic-value`, `python.context-manager`, …) chosen from the error code and the
words of the exception; a case named by torch itself in the exception (a dynamo
`UserError` links its case as `…/exportdb/index.html#case-name`) always comes first.
"""

from __future__ import annotations

import functools
import re

MAX_CASES = 5
"""Never more than this many cases: a short list someone will actually open."""

_CASE_LINK = re.compile(r"exportdb/index\.html#(?P<case>[a-z0-9][a-z0-9-]*)")

# Tags whose examples show the fix for each code, most relevant first.
_TAGS_BY_CODE: dict[str, tuple[str, ...]] = {
    "data_dependent": ("torch.dynamic-value", "torch.cond", "torch.escape-hatch"),
    "dynamic_shape_violation": ("torch.dynamic-shape",),
    "missing_fake_kernel": ("torch.operator",),
}

# Words that make a case's name relevant to a code, on top of the exception's own words.
_KEYWORDS_BY_CODE: dict[str, frozenset[str]] = {
    "data_dependent": frozenset({"predicate", "size", "value", "guard"}),
    "dynamic_shape_violation": frozenset({"dynamic", "shape", "guard", "assert"}),
    "missing_fake_kernel": frozenset({"operator"}),
}

_WORD = re.compile(r"[a-z]+")

# For branch-like data-dependent errors `torch.cond` is the fix, so its tag leads.
_BRANCH_WORDS = re.compile(r"branch|control flow|DYNAMIC_CONTROL_FLOW|torch\.cond", re.IGNORECASE)

# Words of an exception that point at one Python feature, and the tag showing it.
_PYTHON_FEATURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"context manager|__enter__|__exit__|\bwith\b", re.IGNORECASE),
        "python.context-manager",
    ),
    (re.compile(r"closure|nonlocal|nested function", re.IGNORECASE), "python.closure"),
    (re.compile(r"\bassert", re.IGNORECASE), "python.assert"),
    (re.compile(r"\b(dict|list|tuple|pytree)\b"), "python.data-structure"),
    (re.compile(r"control flow|\bloop\b|\bjump\b|iterator", re.IGNORECASE), "python.control-flow"),
    (re.compile(r"setattr|getattr|attribute|__class__", re.IGNORECASE), "python.object-model"),
    (re.compile(r"builtin|skipped|C extension", re.IGNORECASE), "python.builtin"),
    (re.compile(r"standard library|stdlib", re.IGNORECASE), "python.standard-library"),
)


@functools.lru_cache(maxsize=1)
def _catalogue() -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    try:
        from torch._export.db.case import SupportLevel
        from torch._export.db.examples import all_examples

        examples = all_examples()
    except Exception:  # a private module of torch: without it, errors simply link nothing
        return {}, frozenset()
    tags = {name: frozenset(case.tags) for name, case in examples.items()}
    supported = frozenset(
        name for name, case in examples.items() if case.support_level == SupportLevel.SUPPORTED
    )
    return tags, supported


def case_tags() -> dict[str, frozenset[str]]:
    """Every ExportDB case of the installed torch, by name, with its tags.

    Empty when this torch has no ExportDB (it is a private module).
    """
    return _catalogue()[0]


def linked_case(exc_text: str) -> str | None:
    """The ExportDB case torch linked in an exception's text, if it exists in the db."""
    cases = case_tags()
    for match in _CASE_LINK.finditer(exc_text):
        name = match["case"].replace("-", "_")
        if name in cases:
            return name
    return None


def _tags_for(code: str, exc_text: str) -> list[str]:
    tags = list(_TAGS_BY_CODE.get(code, ()))
    if code == "data_dependent" and _BRANCH_WORDS.search(exc_text):
        tags.remove("torch.cond")
        tags.insert(0, "torch.cond")
    if code == "unsupported_python":
        named = [tag for pattern, tag in _PYTHON_FEATURES if pattern.search(exc_text)]
        tags = list(dict.fromkeys([*named, *tags]))
    return tags


def cases_for(code: str, exc_text: str = "") -> list[str]:
    """Names of ExportDB cases that show how to fix an error with `code`.

    Args:
        code: a contract error code (`data_dependent`, `dynamic_shape_violation`, …).
        exc_text: the exception's text, used to pick the Python feature involved and the
            case torch itself linked.

    Returns:
        At most `MAX_CASES` names, sorted; empty for codes no example illustrates.
    """
    cases, supported = _catalogue()
    picked: list[str] = []
    linked = linked_case(exc_text)
    if linked is not None:
        picked.append(linked)
    words = _KEYWORDS_BY_CODE.get(code, frozenset()) | set(_WORD.findall(exc_text.lower()))
    for tag in _tags_for(code, exc_text):
        # Within a tag: names sharing words with the error first, then supported cases
        # (they show code that works), then cases with fewer tags (they are about this tag
        # alone, so they explain it best), then by name.
        tagged = sorted(
            (-len(words.intersection(name.split("_"))), name not in supported, len(tags), name)
            for name, tags in cases.items()
            if tag in tags
        )
        for hits, unsupported, _, name in tagged:
            if unsupported and not hits:
                continue  # an example of what fails helps only when it is about this error
            if len(picked) >= MAX_CASES:
                return sorted(picked)
            if name not in picked:
                picked.append(name)
    return sorted(picked)
