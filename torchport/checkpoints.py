"""Zipping a `save_pretrained` directory for `torchport export DIR` and `torchport submit
DIR` (docs/contract.md §1, *Checkpoints*).

Only what the engine reads is sent: `config.json`, `generation_config.json`, the weights
(`*.safetensors`, `model.safetensors.index.json`; `pytorch_model*.bin` and its index only
when there is no safetensors file) and, for a checkpoint with its own code (`auto_map`),
its top-level `.py` files. Tokenizer files, optimizer states, READMEs and other files
stay behind.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["checkpoint_files", "upload_path", "zip_checkpoint"]

_ALWAYS = ("config.json", "generation_config.json")


def checkpoint_files(directory: Path) -> list[Path]:
    """The files of `directory` a checkpoint upload sends, sorted by name."""
    files = [directory / name for name in _ALWAYS if (directory / name).is_file()]
    safetensors = sorted(directory.glob("*.safetensors"))
    if safetensors:
        files += safetensors + sorted(directory.glob("model.safetensors.index.json"))
    else:
        files += sorted(directory.glob("pytorch_model*.bin"))
        files += sorted(directory.glob("pytorch_model.bin.index.json"))
    if _has_auto_map(directory / "config.json"):
        files += sorted(directory.glob("*.py"))
    return sorted((f for f in files if f.is_file()), key=lambda f: f.name)


def _has_auto_map(config: Path) -> bool:
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and bool(raw.get("auto_map"))


def zip_checkpoint(directory: Path, dest_dir: Path) -> tuple[Path, list[str]]:
    """Zip the checkpoint files of `directory` into `dest_dir/<directory name>.zip`.

    Returns:
        The zip's path and the names of the files in it (config.json missing from them
        leaves the refusal to the engine or the server, which say why).
    """
    files = checkpoint_files(directory)
    archive = dest_dir / f"{directory.resolve().name or 'checkpoint'}.zip"
    # Weights are compressed poorly and read whole by the engine: store them.
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for path in files:
            zf.write(path, path.name)
    return archive, [path.name for path in files]


def upload_path(model: Path, zips: Path, say: Callable[[str], None]) -> Path:
    """`model` itself, or for a directory (a `save_pretrained` checkpoint) a zip of the
    files the engine reads, made under `zips`; `say` is told what was zipped."""
    if not model.is_dir():
        return model
    archive, names = zip_checkpoint(model, zips)
    say(f"checkpoint {model}: sending {', '.join(names) or 'nothing'}")
    return archive
