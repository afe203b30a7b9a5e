"""A checkpoint's tokenizer files, written beside the artifacts as they were uploaded.

The runtimes' generation loops read them next to the model (ONNX Runtime GenAI's
`Model(folder)`, ExecuTorch's `TextLLMRunner(model.pte, tokenizer.json)`). They are
copied byte for byte and never parsed here; which names are taken is
`schemas.model_zip.TOKENIZER_FILES`, each a regular file (no link) of at most
`TOKENIZER_MAX_BYTES`.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from schemas.model_zip import TOKENIZER_FILES, TOKENIZER_MAX_BYTES

__all__ = ["found", "write"]


def found(directory: Path) -> list[str]:
    """The tokenizer files at the base level of the checkpoint unpacked at `directory`."""
    names = []
    for name in TOKENIZER_FILES:
        try:
            info = (directory / name).lstat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size <= TOKENIZER_MAX_BYTES:
            names.append(name)
    return names


def write(directory: Path, names: list[str], out_dir: Path, artifacts: dict[str, Path]) -> None:
    """Copy each of `names` from `directory` into `out_dir`, listed in `artifacts`."""
    for name in names:
        target = out_dir / name
        shutil.copyfile(directory / name, target, follow_symlinks=False)
        artifacts[name] = target
