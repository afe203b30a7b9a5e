"""A package face whose names are imported on first use, as `torch.export` and `pydantic`
keep theirs cheap (PEP 562: a module's `__getattr__` and `__dir__`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["face"]


def face(
    package: str, where: Mapping[str, str], names: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose `names` (its globals) gain each
    name of `where` (name → module holding it) when first asked for."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        names[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*names, *where})

    return getattr_, dir_
