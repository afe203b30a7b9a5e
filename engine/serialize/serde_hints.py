"""`torch.export.load` without re-reading the schema's type hints for every object.

torch's deserializer (`torch._export.serde.serialize._dict_to_dataclass`) rebuilds each
node, argument and tensor description of a program from JSON, and for every one of
them calls `typing.get_type_hints(cls, globalns=vars(schema))`. The schema module has
`from __future__ import annotations`, so each call compiles and evaluates the class's
annotation strings again: about half of a load (a transformer block: 68 → 33 ms; see
docs/sandbox.md). The hints of a schema class never change while a process runs, so
`install()` gives the deserializer module a `typing` of its own whose `get_type_hints`
keeps them per class. Only that module sees it; every other caller of
`typing.get_type_hints` keeps the real one.

Imports only the standard library and torch (it runs in the round trip's torch-only
loader, `engine.serialize.roundtrip`).
"""

from __future__ import annotations

import types
import typing
from typing import Any

__all__ = ["install", "installed"]

_SHIM_NAME = "torchport_typing_for_serde"


def installed() -> bool:
    """Whether torch's deserializer uses the cached hints."""
    from torch._export.serde import serialize

    return getattr(serialize.typing, "__name__", None) == _SHIM_NAME


def install() -> bool:
    """Give torch's deserializer the cached `get_type_hints` (idempotent). False where
    this torch's deserializer is not laid out as expected: it keeps the real one."""
    from torch._export.serde import schema, serialize

    current = getattr(serialize, "typing", None)
    if getattr(current, "__name__", None) == _SHIM_NAME:
        return True
    if current is not typing or not hasattr(serialize, "_dict_to_dataclass"):
        return False
    schema_names = vars(schema)
    real = typing.get_type_hints
    hints: dict[tuple[type, bool], dict[str, Any]] = {}

    def get_type_hints(
        obj: Any,
        globalns: dict[str, Any] | None = None,
        localns: dict[str, Any] | None = None,
        include_extras: bool = False,
    ) -> dict[str, Any]:
        # Only what the deserializer asks: a class, resolved in the schema's namespace.
        if globalns is not schema_names or localns is not None or not isinstance(obj, type):
            return real(obj, globalns, localns, include_extras)
        key = (obj, include_extras)
        found = hints.get(key)
        if found is None:
            found = hints[key] = real(obj, globalns, None, include_extras)
        return dict(found)  # the caller's own copy, as the real one gives

    shim = types.ModuleType(_SHIM_NAME)
    shim.__dict__.update(typing.__dict__)
    shim.__name__ = _SHIM_NAME
    shim.get_type_hints = get_type_hints  # type: ignore[attr-defined]
    serialize.typing = shim
    return True
