"""Text from a job or a server, made safe to print on a terminal.

Everything `torchport` prints that a server or a job wrote — messages, hints, details,
names, ids, report fields, progress — goes through `visible` (plain output) or `markup`
(output through a rich console). A terminal runs the control characters it is sent:
window titles, OSC 52 clipboard writes, screen clears and hyperlinks are escape sequences,
and bidirectional overrides reorder the text around them. So C0 and C1 controls (ESC among
them), DEL, Unicode format characters (bidi overrides and isolates, zero-width and tag
characters), line and paragraph separators and lone surrogates are shown as Python
escapes (`\\x1b`, `\\u202e`) instead. `markup` also escapes rich markup, so `[link=…]` or
`[blink]` in a job's text is shown, never applied. `json_text` writes JSON with every
non-ASCII character escaped, for `--json` output on a terminal.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from rich.markup import escape

__all__ = ["json_text", "markup", "visible"]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Controls, format characters (bidi, zero-width, tags), surrogates, line and paragraph
separators: what a terminal runs or draws invisibly rather than showing."""
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_CANDIDATE = re.compile(r"[^\x20-\x7e]")
"""Printable ASCII is always safe; only the other characters need their category looked up."""


def _escaped(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: object, *, multiline: bool = False) -> str:
    """`text` (made a string) with every character a terminal would run or hide shown as
    its escape; `multiline` keeps newlines and tabs, for text printed over several lines
    by design (an error's message and hint)."""

    def shown(match: re.Match[str]) -> str:
        char = match.group()
        if multiline and char in "\n\t":
            return char
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            return _escaped(char)
        return char

    return _CANDIDATE.sub(shown, str(text))


def markup(text: object, *, multiline: bool = False) -> str:
    """`visible(text)` with rich markup escaped: for text printed through a rich console
    (`Console.print`, table cells, progress descriptions)."""
    return escape(visible(text, multiline=multiline))


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """`value` (JSON data, or a pydantic model) as JSON text with every non-ASCII character
    escaped: C1 controls and bidi overrides, which JSON may carry raw, reach no terminal."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return json.dumps(value, indent=indent, ensure_ascii=True)
