"""torch's list of preservable CompositeImplicitAutograd ops, kept while nothing changes it.

Every `torch.export.export` and `run_decompositions` calls
`torch._export.utils._collect_all_valid_cia_ops` (twice per export here), which walks
every op namespace and, per namespace, materializes every C++ CIA op again: 15 ms with
torch alone (14 namespaces), 35 ms once transformers, diffusers and peft are imported
(35 namespaces; docs/sandbox.md). torch caches the aten part only, because a custom-op
registration can change the rest.

`install()` keeps the answer with what it depends on: the dispatcher's op names, its
CompositeImplicitAutograd registrations, and the ops in the answer that are CIA through a
Python kernel only. A call that finds all three unchanged (~2 ms) returns a copy of the
kept answer; any change (an op defined or deleted, a CIA kernel registered, a Python CIA
kernel put on an op outside the answer or taken off one inside it) makes that call walk
as torch does and keep the new answer. The engine's warm-up installs it (the zygote's
runs after the model libraries' imports), so each job, a fork, starts with the answer
for what the zygote imported; what a job registers is its own and costs it one walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._export.utils as export_utils
import torch._ops

__all__ = ["install", "walks"]

_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
_USERS = ("torch.export.exported_program", "torch.export.decomp_utils")
"""Modules that import `_collect_all_valid_cia_ops` by name."""


@dataclass
class _Kept:
    walk: Callable[[], set[Any]]
    names: list[str]
    cia: list[str]
    python_only: list[Any]
    ops: frozenset[Any]
    stale: bool = False
    walks: int = 0
    """Walks made since install() because something changed."""


_kept: _Kept | None = None


def _state() -> tuple[list[str], list[str]]:
    return (
        torch._C._dispatch_get_all_op_names(),
        torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"),
    )


def _answer(walk: Callable[[], set[Any]]) -> _Kept:
    """Walk as torch does; the answer and the state it was computed in."""
    before = _state()
    ops = frozenset(walk())
    names, cia = _state()
    python_only = [
        op for op in ops if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), _CIA)
    ]
    # a walk that itself changed the dispatcher: walk again on the next call
    return _Kept(walk, names, cia, python_only, ops, stale=(names, cia) != before)


def _collect() -> set[Any]:
    global _kept
    kept = _kept
    assert kept is not None
    names, cia = _state()
    if (
        kept.stale
        or names != kept.names
        or cia != kept.cia
        or not all(_CIA in op.py_kernels for op in kept.python_only)
    ):
        walks = kept.walks + 1
        kept = _kept = _answer(kept.walk)
        kept.walks = walks
    return set(kept.ops)


def _watch_py_impl(py_impl: Callable[..., Any]) -> Callable[..., Any]:
    def watched(self: Any, k: Any) -> Any:
        kept = _kept
        if kept is not None and k == _CIA and self not in kept.ops:
            kept.stale = True
        return py_impl(self, k)

    return watched


def install() -> bool:
    """Keep the current answer (once per process); False when torch's internals this
    relies on are not where they were (then torch walks every time, as without it)."""
    global _kept
    if _kept is not None:
        return True
    import importlib

    users = [importlib.import_module(name) for name in _USERS]
    walk = export_utils._collect_all_valid_cia_ops
    if not callable(walk) or any(getattr(u, walk.__name__, None) is not walk for u in users):
        return False
    _kept = _answer(walk)
    torch._ops.OperatorBase.py_impl = _watch_py_impl(torch._ops.OperatorBase.py_impl)  # type: ignore[method-assign]
    for module in (export_utils, *users):
        module._collect_all_valid_cia_ops = _collect  # type: ignore[attr-defined]
    return True


def walks() -> int | None:
    """Walks made since install() because the dispatcher changed; None when not installed."""
    return None if _kept is None else _kept.walks
