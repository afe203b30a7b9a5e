"""Text that every document of the contract can carry: UTF-8, so no lone surrogates.

A Python string may hold one (`"\\udc80"`: an exception message built from undecodable
bytes, a name made with `surrogateescape`); UTF-8 cannot encode it, so a document holding
it cannot be written or sent. Where the user's (or a job's) text enters a document, each
is replaced by U+FFFD.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["without_surrogates"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(value: Any) -> Any:
    """`value` (a string, or JSON-like lists and dicts of them) with every lone surrogate,
    keys' too, replaced by U+FFFD; other values as they are."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_surrogates(k): without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_surrogates(v) for v in value]
    return value
