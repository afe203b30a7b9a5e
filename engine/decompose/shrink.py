"""Delta debugging over a list: the search for the fewest ops to keep undecomposed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

__all__ = ["shrink"]


def shrink(keep: Sequence[T], passes: Callable[[list[T]], bool]) -> list[T]:
    """Delta debugging: the smallest subset of `keep` found for which `passes` holds.

    `passes(keep)` must hold and `passes([])` is taken to fail. The result is 1-minimal:
    dropping any single element of it makes `passes` fail.
    """
    current = list(keep)
    chunks = 2
    while len(current) >= 2:
        size = -(-len(current) // chunks)
        parts = [current[i : i + size] for i in range(0, len(current), size)]
        for part in parts:
            trial = [item for item in current if item not in part]
            if trial and passes(trial):
                current = trial
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(current):
                break
            chunks = min(chunks * 2, len(current))
    return current
