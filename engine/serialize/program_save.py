"""Saving `program.pt2`: the operator check before the save, `torch.export.save`, and the
early save of a job whose round trip has a loader of its own (the sandbox's).

The round trip's slowest part is the fresh process's `torch.export.load`: it rebuilds the
graph from JSON (dataclasses, sympy expressions, fake tensors), ~8 s for a 250M-parameter
Llama here, against ~5 s to save it. Saved at the start of verification instead of after
it, the program is loaded on the other core while verification runs on this one; the
serializing stage then only writes the documents and waits for what is left of the load.
Verification never changes the program, except when it fails and the pipeline keeps
operators undecomposed to recover (`keep_ops_until_verified`): then the early program is
discarded (its loader dropped, the file removed) and the new one is saved in the
serializing stage, as without the early save; so is a program whose early check or save
failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.diagnostics.source_map import SourceMap
from engine.errors import SerializationFailed
from engine.serialize import foreign_ops

__all__ = ["EarlySave", "save_program"]


def save_program(
    ep: torch.export.ExportedProgram,
    path: Path,
    source_map: SourceMap,
    *,
    check_ops: bool,
    encoder: Any = None,
) -> float:
    """`torch.export.save(ep, path)`; with `check_ops`, first refuse operators a torch-only
    loader cannot resolve (`non_portable_op`), the encoder's too (`encoder`: an
    encoder-decoder model's `EncoderSpec`, saved later by encoder_program). Returns the
    save's seconds."""
    if check_ops:
        foreign_ops.check_ops(ep, source_map)  # before a save whose load would fail
        if encoder is not None and encoder.program is not None:
            foreign_ops.check_ops(encoder.program, source_map)
    started = time.perf_counter()
    try:
        torch.export.save(ep, path)
    except Exception as exc:
        raise SerializationFailed(
            f"torch.export.save failed: {type(exc).__name__}: {exc}",
            hint="Check for constants or custom objects in the model that torch cannot serialize.",
            details={"exception": type(exc).__name__},
        ) from exc
    return time.perf_counter() - started


@dataclass
class EarlySave:
    """The program saved before verification and announced to the round trip's loader.

    A check or save that fails here is not reported here: the file is removed and the
    serializing stage saves as without the early save, so its error comes after
    verification's and at its own stage (with what the sandbox saw the upload attempt
    during it).
    """

    path: Path
    drop: Callable[[], None]
    saved: bool = False
    save_s: float | None = None

    @classmethod
    def begin(
        cls,
        ep: torch.export.ExportedProgram,
        path: Path,
        source_map: SourceMap,
        *,
        prefetch: Callable[[Path], None],
        drop: Callable[[], None],
        encoder: Any = None,
    ) -> EarlySave:
        early = cls(path, drop)
        try:
            early.save_s = save_program(ep, path, source_map, check_ops=True, encoder=encoder)
        except MemoryError:
            raise
        except Exception:  # saved again, and reported, at the serializing stage
            path.unlink(missing_ok=True)
            return early
        early.saved = True
        prefetch(path)
        return early

    def discard(self) -> None:
        """The program changed after the save: stop its loader and remove the file; the
        serializing stage checks and saves the new program."""
        if self.saved:
            self.drop()
            self.path.unlink(missing_ok=True)
        self.saved, self.save_s = False, None
